"""The Responses API's input as its clients send it: items (messages, function calls and
their outputs), their content parts, and the tools a request offers.

Each union has a catch-all member for the kinds OpenAI defines and tokenrelay does not serve
(images, files, audio, reasoning items, item references, built-in tools such as
`web_search`): validation keeps them, and `schema.py` refuses them with a 400 that names the
field and says why, rather than pydantic's list of the tags it expected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from tokenrelay.api.openai.field_support import StrictPart
from tokenrelay.api.openai.tools import FunctionDefinition

ItemStatus = Literal["in_progress", "completed", "incomplete"]
_HISTORY = "Accepted with a history item (as clients send back a response's output), not rendered."


class InputText(StrictPart):
    type: Literal["input_text"]
    text: str


class OutputText(StrictPart):
    """An assistant turn's text, as a previous response's output carries it."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = Field(default=None, description=_HISTORY)
    logprobs: list[Any] | None = Field(default=None, description=_HISTORY)


class UnservedPart(BaseModel):
    """A content part of a kind the served models cannot read (`input_image`, `input_file`,
    `input_audio`, `refusal`...): refused by name."""

    model_config = ConfigDict(extra="allow")

    type: str


def _tag(value: Any, known: dict[str, str], default: str | None = None) -> str:
    """The union member's tag for a value's `type`. Tags are spelled as class names, which
    an error's location leaves out (`api.errors`): `input.0.role`, not `input.0.message.role`."""
    kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", None)
    return known.get(kind, "Other") if isinstance(kind, str) else "Other"


_PARTS = {"input_text": "InputText", "output_text": "OutputText"}
ContentPart = Annotated[
    Annotated[InputText, Tag("InputText")]
    | Annotated[OutputText, Tag("OutputText")]
    | Annotated[UnservedPart, Tag("Other")],
    Discriminator(lambda value: _tag(value, _PARTS)),
]


class MessageItem(StrictPart):
    """A turn; `type` may be left out (OpenAI's "easy" input message)."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = Field(default=None, description=_HISTORY)
    status: ItemStatus | None = Field(default=None, description=_HISTORY)
    phase: Literal["commentary", "final_answer"] | None = Field(default=None, description=_HISTORY)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, InputText | OutputText))


class FunctionCallItem(StrictPart):
    """A call the model made, sent back as history (its output follows as
    `function_call_output`)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    namespace: str | None = Field(
        default=None, description="The namespace tool group the function belongs to."
    )
    id: str | None = Field(default=None, description=_HISTORY)
    status: ItemStatus | None = Field(default=None, description=_HISTORY)


class FunctionCallOutputItem(StrictPart):
    """What a call returned: rendered as a `tool` turn answering `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = Field(default=None, description=_HISTORY)
    status: ItemStatus | None = Field(default=None, description=_HISTORY)

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(p.text for p in self.output if isinstance(p, InputText | OutputText))


class UnservedItem(BaseModel):
    """An item of a kind tokenrelay does not serve (`reasoning`, `item_reference`, built-in
    tool calls...): refused by name."""

    model_config = ConfigDict(extra="allow")

    type: str


_ITEMS = {
    "message": "Message",
    "function_call": "FunctionCall",
    "function_call_output": "FunctionCallOutput",
}
InputItem = Annotated[
    Annotated[MessageItem, Tag("Message")]
    | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")]
    | Annotated[UnservedItem, Tag("Other")],
    Discriminator(lambda value: _tag(value, _ITEMS, default="message")),
]
ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])


class FunctionToolSpec(FunctionDefinition):
    """A function the model may call (the Responses shape: chat's definition with its
    `type` beside it, no `function` wrapper)."""

    type: Literal["function"]


class NamespaceTool(StrictPart):
    """A named group of functions (the Codex CLI sends its tools so): each is offered to the
    model as a function, and a call of one names the group in its `namespace`."""

    type: Literal["namespace"]
    name: str = Field(min_length=1)
    description: str | None = None
    tools: list[FunctionToolSpec] = Field(min_length=1)


class UnservedTool(BaseModel):
    """A built-in tool (`web_search`, `file_search`, `computer_use_preview`, `mcp`...):
    refused by name."""

    model_config = ConfigDict(extra="allow")

    type: str


_TOOLS = {"function": "Function", "namespace": "Namespace"}
ToolSpec = Annotated[
    Annotated[FunctionToolSpec, Tag("Function")]
    | Annotated[NamespaceTool, Tag("Namespace")]
    | Annotated[UnservedTool, Tag("Other")],
    Discriminator(lambda value: _tag(value, _TOOLS)),
]


class FunctionChoice(StrictPart):
    type: Literal["function"]
    name: str = Field(min_length=1)


class UnservedChoice(BaseModel):
    """A `tool_choice` naming a built-in tool or an `allowed_tools` list: refused by name."""

    model_config = ConfigDict(extra="allow")

    type: str


ToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[
        Annotated[FunctionChoice, Tag("Function")] | Annotated[UnservedChoice, Tag("Other")],
        Discriminator(lambda value: _tag(value, {"function": "Function"})),
    ]
)


def stored_items(items: list[InputItem], job_id: str) -> list[dict[str, Any]]:
    """The input items as a stored response keeps them (`input_items`, and the history of a
    response that continues it): each with an id and a status, a message's text as parts."""
    stored: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        fields = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(item, MessageItem):
            fields["type"] = "message"
            if isinstance(item.content, str):
                kind = "output_text" if item.role == "assistant" else "input_text"
                fields["content"] = [{"type": kind, "text": item.content}]
        prefix = {"message": "msg", "function_call": "fc"}.get(fields["type"], "fco")
        fields.setdefault("id", f"{prefix}_{job_id}_in{index}")
        fields.setdefault("status", "completed")
        stored.append(fields)
    return stored
