"""The body of `POST /v1/responses`: every field of OpenAI's request is implemented, accepted
with no effect (what a standard client such as the Codex CLI sends by default and no served
model can act on: named in the `x-tokenrelay-no-effect` header), or refused with a 400 that
names it (`api.openai.field_support`). `conversation.py` turns it into the chat path's
request, so the bounds, tools and structured outputs are checked and run exactly as a chat
completion's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from tokenrelay.api.openai.field_support import StrictPart, no_effect, refused
from tokenrelay.api.openai.schema import MAX_TOP_LOGPROBS
from tokenrelay.api.openai.tools import MAX_TOOLS
from tokenrelay.api.responses.items import InputItem, MessageItem, ToolChoice, ToolSpec
from tokenrelay.shared.redis.rq_jobs import Priority

MAX_METADATA = 16


class TextFormatText(StrictPart):
    type: Literal["text"]


class TextFormatJsonObject(StrictPart):
    """Any JSON object (enforced while decoding)."""

    type: Literal["json_object"]


class TextFormatJsonSchema(StrictPart):
    """JSON matching `schema`, enforced while decoding."""

    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = Field(
        default=None, description="Accepted either way: the schema is always enforced."
    )


TextFormat = Annotated[
    TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
]


class TextConfig(StrictPart):
    format: TextFormat | None = None
    verbosity: Any = refused("the served models have no verbosity control")


class ResponseStreamOptions(StrictPart):
    include_obfuscation: bool | None = Field(
        default=None, description="Only `false` (or absent): tokenrelay pads no stream events."
    )


class ResponseRequest(StrictPart):
    """The body of `POST /v1/responses`."""

    model: str = Field(min_length=1)
    input: str | list[InputItem] | None = Field(
        default=None,
        description="A user message's text, or items: messages (roles `user`, `assistant`, "
        "`system`, `developer`; text or `input_text` / `output_text` parts), "
        "`function_call` and `function_call_output`.",
    )
    instructions: str | None = Field(
        default=None,
        description="A system message before the input; a previous response's instructions "
        "are not carried over (as OpenAI does).",
    )
    previous_response_id: str | None = Field(
        default=None,
        description="Continue a stored response: its chain's input and output items come "
        "first, read from Redis by any API process.",
    )
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Each output token's log probability and this many likeliest candidates, "
        "in the `output_text` parts and deltas.",
    )
    tools: list[ToolSpec] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="Functions (and `namespace` groups of functions, offered to the model as "
        "functions) the model may call; built-in tools are refused.",
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description="`none`, `auto` (the default with tools), `required` or "
        '`{"type": "function", "name": ...}`; `required` and a named function constrain '
        "decoding to one call valid for the function's `parameters`.",
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="`false`: only the reply's first call is kept."
    )
    text: TextConfig | None = Field(
        default=None,
        description="`format`: `text`, `json_object` or `json_schema`, enforced while decoding.",
    )
    stream: bool = False
    stream_options: ResponseStreamOptions | None = None
    store: bool | None = Field(
        default=None,
        description="Default true: the response and its input are kept in Redis "
        "(TOKENRELAY_RESPONSES_TTL_S) for `GET`, `previous_response_id` and `input_items`; "
        "`false` leaves nothing retrievable.",
    )
    background: bool | None = Field(
        default=None,
        description="Run without a listener: answered at once (status `queued`), polled with "
        "`GET`, streamed and resumed with `?stream=true&starting_after=N`, cancelled with "
        "`POST .../cancel`. Needs `store`.",
    )
    truncation: Literal["auto", "disabled"] | None = Field(
        default=None,
        description="`auto`: the oldest turns are dropped until the prompt fits the context "
        "window; `disabled`: an overflow is a 400; absent: TOKENRELAY_TRUNCATE_MESSAGES.",
    )
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None,
        max_length=MAX_METADATA,
        description="Up to 16 pairs, stored and echoed with the response.",
    )
    service_tier: Literal["auto", "default"] | None = Field(
        default=None, description="Only `auto` or `default`: there is one tier."
    )
    priority: Priority | None = Field(
        default=None, description="tokenrelay's: the job's queue (default: the key's)."
    )
    user: str | None = no_effect("OpenAI's end-user id for abuse monitoring")
    safety_identifier: str | None = no_effect("OpenAI's end-user id for abuse monitoring")
    prompt_cache_key: str | None = no_effect("OpenAI's prompt cache routing hint")
    reasoning: dict[str, Any] | None = no_effect(
        "reasoning effort and summaries; the served models do not reason (sent by the Codex CLI)"
    )
    include: list[str] | None = no_effect(
        "extra output such as `reasoning.encrypted_content`; the served models produce no "
        "reasoning (sent by the Codex CLI); log probabilities come with `top_logprobs`"
    )
    client_metadata: dict[str, Any] | None = no_effect(
        "the Codex CLI's description of itself to the server"
    )
    conversation: Any = refused("conversations are not implemented; use `previous_response_id`")
    prompt: Any = refused("stored prompt templates are not implemented")
    max_tool_calls: Any = refused("built-in tool calls are not served")
    prompt_cache_retention: Any = refused("OpenAI's prompt cache settings")
    prompt_cache_options: Any = refused("OpenAI's prompt cache settings")
    background_options: Any = refused("there is one completion window")
    context_management: Any = refused("server-side context compaction is not implemented")
    moderation: Any = refused("there are no moderation policies")
    image: Any = refused("the served models take and generate text only")
    access_programs: Any = refused("OpenAI's access programs")

    def input_items(self) -> list[InputItem]:
        """The input as items: a string is one user message."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input or [])

    @property
    def stored(self) -> bool:
        return self.store is not False

    @property
    def in_background(self) -> bool:
        return bool(self.background)
