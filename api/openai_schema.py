"""OpenAI-compatible request and response bodies, and their validation into a
`GenerationRequest` with messages that name the field and the bound."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.events import Usage
from tokenrelay.shared.generation import ChatMessage, GenerationRequest
from tokenrelay.shared.rq_jobs import Priority
from tokenrelay.shared.settings import Settings

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


class SamplingFields(BaseModel):
    """Fields and checks that chat and text completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    priority: Priority | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None

    def _generation(
        self,
        settings: Settings,
        max_tokens: int | None,
        *,
        messages: tuple[ChatMessage, ...] = (),
        prompt: str | None = None,
    ) -> GenerationRequest:
        if self.n != 1:
            raise InvalidRequest(f"`n` must be 1 (one choice per request), got {self.n}", param="n")
        max_tokens = max_tokens or settings.default_max_tokens
        if max_tokens > settings.max_tokens_limit:
            raise InvalidRequest(
                f"`max_tokens` must be <= {settings.max_tokens_limit}, got {max_tokens}",
                param="max_tokens",
            )
        if max_tokens >= settings.worker_max_batch_tokens:
            raise InvalidRequest(
                f"`max_tokens` ({max_tokens}) plus the prompt can never fit a worker's batch of "
                f"{settings.worker_max_batch_tokens} tokens (TOKENRELAY_WORKER_MAX_BATCH_TOKENS)",
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
        for index, stop in enumerate(stops):
            _check_unicode(stop, f"stop.{index}")
        if prompt is not None:
            _check_unicode(prompt, "prompt")
        return GenerationRequest(
            model=self.model,
            messages=messages,
            prompt=prompt,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=tuple(stops),
            include_stop_str_in_output=self.include_stop_str_in_output,
            seed=self.seed,
        )


class ChatCompletionRequest(SamplingFields):
    """The body of `POST /v1/chat/completions` (and `POST /v1/jobs`)."""

    messages: list[InputMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    tools: list[dict[str, Any]] | None = None

    def to_generation(self, settings: Settings) -> GenerationRequest:
        """Check what the schema cannot and build the request the worker runs."""
        if self.logprobs:
            raise InvalidRequest("`logprobs` is not supported", param="logprobs")
        if self.tools:
            raise InvalidRequest("`tools` (function calling) is not supported", param="tools")
        messages = tuple(
            ChatMessage(role="system" if m.role == "developer" else m.role, content=_content(m, i))
            for i, m in enumerate(self.messages)
        )
        max_tokens = self.max_completion_tokens or self.max_tokens
        return self._generation(settings, max_tokens, messages=messages)


class CompletionRequest(SamplingFields):
    """The body of `POST /v1/completions` (a raw prompt, no chat template)."""

    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def to_generation(self, settings: Settings) -> GenerationRequest:
        for name in ("logprobs", "suffix", "best_of"):
            if getattr(self, name) is not None:
                raise InvalidRequest(f"`{name}` is not supported", param=name)
        if self.echo:
            raise InvalidRequest("`echo` is not supported", param="echo")
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest(
                    f"`prompt` takes one string per request, got a list of {len(prompt)}",
                    param="prompt",
                )
            prompt = prompt[0]
        if not prompt:
            raise InvalidRequest("`prompt` must not be empty", param="prompt")
        return self._generation(settings, self.max_tokens, prompt=prompt)


def _content(message: InputMessage, index: int) -> str:
    """The message's text; only an assistant turn of the history may be empty."""
    text = message.text()
    field = f"messages.{index}.content"
    if not text and message.role != "assistant":
        raise InvalidRequest(
            f"`{field}` must not be empty in a {message.role} message", param=field
        )
    _check_unicode(text, field)
    return text


def _check_unicode(text: str, field: str) -> None:
    """JSON's `\\ud800` escapes decode to lone surrogates, which no tokenizer or UTF-8 takes."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"`{field}` is not valid Unicode: a lone surrogate at character {exc.start}",
            param=field,
        ) from None


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


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(BaseModel):
    """`POST /v1/completions` response, and (with partial `text`) each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
