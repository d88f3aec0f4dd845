"""OpenAI-compatible request and response bodies, and their validation into a
`GenerationRequest` with messages that name the field and the bound."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import InvalidRequest
from shared.events import Usage
from shared.generation import ChatMessage, GenerationRequest
from shared.settings import Settings

MAX_STOP_STRINGS = 4


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The body of `POST /v1/chat/completions` (and `POST /v1/jobs`)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    logprobs: bool | None = None
    tools: list[dict[str, Any]] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None

    def to_generation(self, settings: Settings) -> GenerationRequest:
        """Check what the schema cannot and build the request the worker runs."""
        if self.n != 1:
            raise InvalidRequest(f"`n` must be 1 (one choice per request), got {self.n}", param="n")
        if self.logprobs:
            raise InvalidRequest("`logprobs` is not supported", param="logprobs")
        if self.tools:
            raise InvalidRequest("`tools` (function calling) is not supported", param="tools")
        max_tokens = self.max_completion_tokens or self.max_tokens or settings.default_max_tokens
        if max_tokens > settings.max_tokens_limit:
            raise InvalidRequest(
                f"`max_tokens` must be <= {settings.max_tokens_limit}, got {max_tokens}",
                param="max_tokens",
            )
        if self.min_tokens > max_tokens:
            raise InvalidRequest(
                f"`min_tokens` must be <= `max_tokens` ({max_tokens}), got {self.min_tokens}",
                param="min_tokens",
            )
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise InvalidRequest(
                f"`stop` takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", param="stop"
            )
        if any(not s for s in stops):
            raise InvalidRequest("`stop` strings must not be empty", param="stop")
        return GenerationRequest(
            model=self.model,
            messages=tuple(
                ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text())
                for m in self.messages
            ),
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=tuple(stops),
            seed=self.seed,
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenrelay"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
