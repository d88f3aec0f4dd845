"""The parts of an Anthropic Messages request: content blocks, tools and `tool_choice`.

Blocks and tools are tagged unions whose unknown or unimplemented kinds validate into a
catch-all (`OtherBlockParam`, `ServerToolParam`) that the conversion refuses with a 400 saying why
(`refusal`), rather than a schema error that only lists the tags it expected. The union
tags are capitalised, so a validation error's location names the field alone
(`api.errors.validation_message` drops them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from tokenrelay.api.openai.field_support import StrictPart, no_effect, refused

CACHE_CONTROL = (
    "Anthropic's prompt cache breakpoint; the workers' prefix cache reuses a prompt's "
    "blocks without one"
)
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
SERVER_TOOLS_REFUSED = "server tools are not implemented: tokenrelay runs only the client's tools"
#: Why each kind of Anthropic content block that tokenrelay does not implement is refused.
_REFUSED_BLOCKS = {
    "image": "the served models read text only",
    "document": "the served models read text only; send the document's text in a `text` block",
    "search_result": "search result blocks (with their citations) are not implemented",
    "thinking": "the served models do not think in blocks of their own",
    "redacted_thinking": "the served models do not think in blocks of their own",
    "container_upload": "there are no code execution containers",
    "server_tool_use": SERVER_TOOLS_REFUSED,
    "mcp_tool_use": "tokenrelay connects to no MCP servers",
    "mcp_tool_result": "tokenrelay connects to no MCP servers",
}


class TextBlockParam(StrictPart):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = no_effect(CACHE_CONTROL)
    citations: Any = refused("citations are not implemented")


class OtherBlockParam(StrictPart):
    """Any other kind of block (images, documents, thinking, server tool results, ...):
    refused by the conversion, with why (`refusal`)."""

    model_config = ConfigDict(extra="allow")

    type: str

    def refusal(self) -> str:
        reason = _REFUSED_BLOCKS.get(self.type)
        if reason is None and self.type.endswith("_tool_result"):
            reason = SERVER_TOOLS_REFUSED
        return reason or "not a content block of Anthropic's Messages API that tokenrelay reads"


def _text_or_other(value: Any) -> str:
    return "Text" if _kind(value) == "text" else "Other"


def _block_tag(value: Any) -> str:
    return {"text": "Text", "tool_use": "ToolUse", "tool_result": "ToolResult"}.get(
        _kind(value) or "", "Other"
    )


def _kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


TextOrOther = Annotated[
    Annotated[TextBlockParam, Tag("Text")] | Annotated[OtherBlockParam, Tag("Other")],
    Discriminator(_text_or_other),
]


class ToolUseBlockParam(StrictPart):
    """A call of an assistant turn in the history."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = no_effect(CACHE_CONTROL)
    caller: Any = refused("programmatic tool calling is not implemented")
    toolset_name: Any = refused("tool sets are not implemented")


class ToolResultBlockParam(StrictPart):
    """A user turn's answer to a call: its text is what the model reads."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextOrOther] = ""
    is_error: bool | None = no_effect(
        "the chat template has no place for it; the result's text is what the model reads"
    )
    cache_control: dict[str, Any] | None = no_effect(CACHE_CONTROL)
    toolset_name: Any = refused("tool sets are not implemented")

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return join(block.text for block in self.content if isinstance(block, TextBlockParam))


ContentBlockParam = Annotated[
    Annotated[TextBlockParam, Tag("Text")]
    | Annotated[ToolUseBlockParam, Tag("ToolUse")]
    | Annotated[ToolResultBlockParam, Tag("ToolResult")]
    | Annotated[OtherBlockParam, Tag("Other")],
    Discriminator(_block_tag),
]


def join(texts: Iterable[str]) -> str:
    """The text of several blocks of one turn, a blank line apart."""
    return "\n\n".join(texts)


class ToolParam(StrictPart):
    """A tool the client runs: offered to the model as a function (its `input_schema` the
    function's parameters), its calls answered as `tool_use` blocks."""

    type: Literal["custom"] | None = None
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = Field(
        default=None,
        description="Accepted either way: a forced call always matches `input_schema`, an "
        "`auto` call is parsed as the model wrote it.",
    )
    eager_input_streaming: bool | None = Field(
        default=None, description="Accepted either way: a call's input streams as it is written."
    )
    cache_control: dict[str, Any] | None = no_effect(CACHE_CONTROL)
    defer_loading: Any = refused("tool search is not implemented")
    input_examples: Any = refused("the chat template has no place for input examples")
    allowed_callers: Any = refused("programmatic tool calling is not implemented")


class ServerToolParam(StrictPart):
    """Any of Anthropic's server tools (web search, code execution, ...): refused."""

    model_config = ConfigDict(extra="allow")

    type: str


def _tool_tag(value: Any) -> str:
    return "Custom" if _kind(value) in (None, "custom") else "Server"


AnyToolParam = Annotated[
    Annotated[ToolParam, Tag("Custom")] | Annotated[ServerToolParam, Tag("Server")],
    Discriminator(_tool_tag),
]


class ToolChoiceParam(StrictPart):
    """`auto` (the default with tools), `any` (one call of any tool, constrained while
    decoding), `tool` (one call of `name`, constrained) or `none` (no tools offered)."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, description="With `tool`: the tool to call.")
    disable_parallel_tool_use: bool | None = Field(
        default=None, description="`true`: only the reply's first call is kept."
    )
