"""OpenAI-compatible request and response bodies, and their validation into a
`GenerationRequest` with messages that name the field and the bound."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from tokenrelay.api.openai.field_support import StrictPart, check_refused, no_effect, refused
from tokenrelay.api.openai.tools import (
    MAX_TOOLS,
    InputToolCall,
    OutputToolCall,
    Tool,
    ToolCallDelta,
    ToolChoice,
    ToolSelection,
    history_calls,
    select_tools,
)
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.events import TokenLogprob, Usage
from tokenrelay.shared.generation import ChatMessage, GenerationRequest
from tokenrelay.shared.redis.rq_jobs import Priority
from tokenrelay.shared.settings import Settings

MAX_STOP_STRINGS = 4
MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_TOP_LOGPROBS = 20
#: A list `prompt` runs one job per string, each admitted like a request of its own.
MAX_PROMPTS = 16
_FUNCTIONS = "OpenAI's deprecated function calling; send `tools` and `tool_choice`"


class TextPart(StrictPart):
    type: Literal["text"]
    text: str


class InputMessage(StrictPart):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = refused("the chat template has no place for a participant's name")
    tool_calls: list[InputToolCall] | None = Field(
        default=None, description="An assistant turn's calls, rendered by the chat template."
    )
    tool_call_id: str | None = Field(
        default=None, min_length=1, description="A `tool` turn: the call it answers."
    )
    function_call: Any = refused(_FUNCTIONS)
    refusal: Any = refused("an assistant turn's refusal text; send it as `content`")
    audio: Any = refused("the served models take and generate text only")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class TextFormat(StrictPart):
    type: Literal["text"]


class JsonObjectFormat(StrictPart):
    """Any JSON object (enforced while decoding, no whitespace between tokens)."""

    type: Literal["json_object"]


class JsonSchemaSpec(StrictPart):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = Field(
        default=None, description="Accepted either way: the schema is always enforced."
    )


class JsonSchemaFormat(StrictPart):
    """JSON matching `json_schema.schema`, enforced while decoding."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StreamOptions(StrictPart):
    include_usage: bool = False
    include_obfuscation: bool | None = Field(
        default=None,
        description="Only `false` (or absent): tokenrelay pads no stream chunks.",
    )


class SamplingFields(StrictPart):
    """Fields and checks that chat and text completions share."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(
        default=0, ge=0, description="vLLM's extension: no end-of-sequence before this many."
    )
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = Field(
        default=False, description="vLLM's extension: keep the stop string in the text."
    )
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, description="Only 1: one choice per request.")
    priority: Priority | None = Field(
        default=None, description="tokenrelay's: the job's queue (default: the key's)."
    )
    user: str | None = no_effect("OpenAI's end-user id for abuse monitoring")
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        default=None,
        max_length=MAX_LOGIT_BIAS,
        description="Token id (a decimal string) to a bias in [-100, 100] added to its logit.",
    )
    top_k: int | None = Field(
        default=None,
        ge=-1,
        description="vLLM's extension: sample from the k likeliest; -1 or 0: all.",
    )
    repetition_penalty: float | None = Field(
        default=None,
        gt=0.0,
        le=2.0,
        description="vLLM's extension: divides positive (multiplies negative) logits of every "
        "token already in the prompt or output; 1 is none.",
    )
    ignore_eos: bool = Field(
        default=False, description="vLLM's extension: never sample end-of-sequence."
    )
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        max_length=MAX_STOP_TOKEN_IDS,
        description="vLLM's extension: token ids that end the completion like end-of-sequence.",
    )

    def _generation(
        self,
        settings: Settings,
        max_tokens: int | None,
        *,
        messages: tuple[ChatMessage, ...] = (),
        prompt: str | None = None,
        logprobs: int | None = None,
    ) -> GenerationRequest:
        check_refused(self)
        if self.n != 1:
            raise InvalidRequest(f"`n` must be 1 (one choice per request), got {self.n}", param="n")
        if self.stream_options is not None and self.stream_options.include_obfuscation:
            raise InvalidRequest(
                "`stream_options.include_obfuscation` is not supported: tokenrelay pads no "
                "stream chunks",
                param="stream_options.include_obfuscation",
            )
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
            top_k=None if self.top_k is None else max(self.top_k, 0),
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            logit_bias=self._logit_bias(),
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            logprobs=logprobs,
        )

    def _logit_bias(self) -> dict[int, float]:
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            field = f"logit_bias.{key[:20]}"
            if not (key.isascii() and key.isdigit() and len(key) <= 9):
                raise InvalidRequest(
                    f"`{field}`: `logit_bias` keys must be token ids (decimal strings)",
                    param=field,
                )
            if not -100 <= value <= 100:
                raise InvalidRequest(
                    f"`{field}` must be between -100 and 100, got {value}", param=field
                )
            bias[int(key)] = value
        return bias


class ChatCompletionRequest(SamplingFields):
    """The body of `POST /v1/chat/completions` (and `POST /v1/jobs`)."""

    messages: list[InputMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = no_effect("OpenAI's tags for stored completions")
    safety_identifier: str | None = no_effect("OpenAI's end-user id for abuse monitoring")
    prompt_cache_key: str | None = no_effect("OpenAI's prompt cache routing hint")
    store: bool | None = Field(default=None, description="Only `false`: nothing is stored.")
    service_tier: Literal["auto", "default"] | None = Field(
        default=None, description="Only `auto` or `default`: there is one tier."
    )
    modalities: list[Literal["text"]] | None = Field(default=None, description='Only `["text"]`.')
    response_format: ResponseFormat | None = Field(
        default=None,
        description="`json_object` and `json_schema` are enforced while decoding (xgrammar, "
        "in the worker), per job inside the shared batch.",
    )
    logprobs: bool | None = Field(
        default=None,
        description="Each generated token's log probability, from the model's raw "
        "distribution (before penalties, biases, temperature, top-k and top-p), as vLLM.",
    )
    top_logprobs: int | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS, description="Needs `logprobs: true`."
    )
    tools: list[Tool] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TOOLS,
        description="Functions the model may call: rendered by the chat template (Qwen2's "
        "format), calls parsed from the reply into `tool_calls`.",
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description="`none`, `auto` (the default with tools), `required` or a named "
        "function; `required` and a named function constrain decoding to one call whose "
        "arguments are valid JSON for the function's `parameters`.",
    )
    parallel_tool_calls: bool | None = Field(
        default=None,
        description="`false`: only the reply's first call is kept (a forced call is one).",
    )
    functions: Any = refused(_FUNCTIONS)
    function_call: Any = refused(_FUNCTIONS)
    audio: Any = refused("the served models generate text only")
    prediction: Any = refused("predicted outputs are not implemented")
    reasoning_effort: Any = refused("the served models do not reason")
    verbosity: Any = refused("the served models have no verbosity control")
    web_search_options: Any = refused("there is no web search")
    moderation: Any = refused("there are no moderation policies")
    prompt_cache_retention: Any = refused("OpenAI's prompt cache settings")
    prompt_cache_options: Any = refused("OpenAI's prompt cache settings")

    def to_generation(self, settings: Settings) -> GenerationRequest:
        """Check what the schema cannot and build the request the worker runs."""
        for i, message in enumerate(self.messages):
            check_refused(message, prefix=f"messages.{i}.")
        if self.store:
            raise InvalidRequest(
                "`store: true` is not supported: tokenrelay stores no completions", param="store"
            )
        messages = tuple(_chat_message(m, i) for i, m in enumerate(self.messages))
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens or self.max_tokens
        generation = self._generation(settings, max_tokens, messages=messages, logprobs=logprobs)
        tools = self.tool_selection()
        for i, tool in enumerate(self.tools or []):
            _check_unicode(json.dumps(tool.model_dump(), ensure_ascii=False), f"tools.{i}")
        json_schema = self._json_schema()
        if tools.call_schema is not None and json_schema is not None:
            raise InvalidRequest(
                "a JSON `response_format` cannot be combined with a forced `tool_choice`: the "
                "reply is the tool call",
                param="response_format",
            )
        update: dict[str, Any] = {"tools": tools.tools}
        if tools.call_schema is not None:
            json_schema = tools.call_schema
            update["tool_call"] = True
        if json_schema is None:
            return generation.model_copy(update=update)
        for name in ("ignore_eos", "min_tokens"):
            if getattr(self, name):
                what = "a forced `tool_choice`" if tools.call_schema else "a JSON `response_format`"
                raise InvalidRequest(
                    f"`{name}` cannot be combined with {what}: the reply ends where its "
                    "grammar does",
                    param=name,
                )
        return generation.model_copy(update=update | {"json_schema": json_schema})

    def tool_selection(self) -> ToolSelection:
        return select_tools(self.tools, self.tool_choice, self.parallel_tool_calls)

    def _json_schema(self) -> str | None:
        """The JSON schema `response_format` asks for, as JSON text; None for plain text."""
        match self.response_format:
            case JsonObjectFormat():
                return json.dumps({"type": "object", "additionalProperties": True})
            case JsonSchemaFormat(json_schema=spec):
                return json.dumps(spec.schema_ or {"type": "object"})
        return None


class CompletionRequest(SamplingFields):
    """The body of `POST /v1/completions` (a raw prompt, no chat template)."""

    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = Field(default=False, description="Only `false`: the prompt is not echoed.")
    best_of: int | None = Field(default=None, ge=1, description="Only 1.")
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Each token's log probability and this many likeliest candidates, from "
        "the model's raw distribution (before penalties, biases, temperature, top-k, top-p).",
    )
    suffix: Any = refused("insertion (fill in the middle) is not implemented")

    def to_generations(self, settings: Settings) -> list[GenerationRequest]:
        """One generation per prompt (a list prompt answers one choice per string)."""
        if self.echo:
            raise InvalidRequest("`echo` is not supported: the prompt is not echoed", param="echo")
        if self.best_of not in (None, 1):
            raise InvalidRequest(
                f"`best_of` must be 1 (one candidate per choice), got {self.best_of}",
                param="best_of",
            )
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not 1 <= len(prompts) <= MAX_PROMPTS:
            raise InvalidRequest(
                f"`prompt` takes 1 to {MAX_PROMPTS} strings, got {len(prompts)}", param="prompt"
            )
        for i, prompt in enumerate(prompts):
            if not prompt:
                field = "prompt" if isinstance(self.prompt, str) else f"prompt.{i}"
                raise InvalidRequest(f"`{field}` must not be empty", param=field)
        return [
            self._generation(settings, self.max_tokens, prompt=p, logprobs=self.logprobs)
            for p in prompts
        ]


def _chat_message(message: InputMessage, index: int) -> ChatMessage:
    prefix = f"messages.{index}."
    if message.tool_calls is not None and message.role != "assistant":
        raise InvalidRequest(
            f"`{prefix}tool_calls` belongs to an assistant turn, not a {message.role} one",
            param=f"{prefix}tool_calls",
        )
    if (message.tool_call_id is None) != (message.role != "tool"):
        raise InvalidRequest(
            f"`{prefix}tool_call_id` is required in a tool turn and only there",
            param=f"{prefix}tool_call_id",
        )
    for j, call in enumerate(message.tool_calls or []):
        _check_unicode(json.dumps(call.model_dump(), ensure_ascii=False), f"{prefix}tool_calls.{j}")
    _check_unicode(message.tool_call_id or "", f"{prefix}tool_call_id")
    return ChatMessage(
        role="system" if message.role == "developer" else message.role,
        content=_content(message, index),
        tool_calls=history_calls(message.tool_calls),
        tool_call_id=message.tool_call_id,
    )


def _content(message: InputMessage, index: int) -> str:
    """The message's text; only an assistant or tool turn of the history may be empty."""
    text = message.text()
    field = f"messages.{index}.content"
    if not text and message.role not in ("assistant", "tool"):
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
    """The reply: `content` is None when it is only tool calls; `tool_calls` is left out
    when there are none."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[OutputToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_no_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("tool_calls") is None:
            out.pop("tool_calls", None)
        return out


class ChoiceLogprobs(BaseModel):
    """OpenAI's chat `logprobs`: one entry per generated token."""

    content: list[TokenLogprob] | None
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class PromptTokensDetails(BaseModel):
    #: Prompt tokens whose KV the worker's prefix cache held: not prefilled again.
    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    """OpenAI's usage object (chat and completions), from a job's `Usage`."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, usage: Usage) -> CompletionUsage:
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        )


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage


class Delta(BaseModel):
    """A chunk's change; fields it does not carry are left out, as OpenAI does (`role`
    only in the first chunk, `{}` in the finish chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenrelay"
    tool_call_parser: str = Field(
        description="tokenrelay's: how calls are read out of this model's replies when a "
        "request offers `tools` (`TOKENRELAY_TOOL_CALL_PARSER` of its workers): `qwen` (or "
        "its other name `hermes`) for `<tool_call>` tags, `json` for a reply that is one JSON "
        "call, bare or fenced."
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions `logprobs`: parallel lists, one entry per token;
    `text_offset` is where each token's text starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, logprobs: list[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
        offsets = []
        for entry in logprobs:
            offsets.append(offset)
            offset += len(entry.token)
        return cls(
            tokens=[entry.token for entry in logprobs],
            token_logprobs=[entry.logprob for entry in logprobs],
            top_logprobs=[{t.token: t.logprob for t in entry.top_logprobs} for entry in logprobs],
            text_offset=offsets,
        )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """`POST /v1/completions` response, and (with partial `text`) each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
