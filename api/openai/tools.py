"""OpenAI's function calling in request and response bodies: `tools`, `tool_choice`, the
calls of an assistant turn, and their streamed deltas.

`tool_choice` `none` offers no tools (the template renders none, the reply is text);
`auto` (the default with tools) renders them and parses calls out of the reply;
`required` and a named function also constrain decoding to exactly one call, valid JSON
for the function's `parameters` (`ToolSelection.call_schema`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from tokenrelay.api.openai.field_support import StrictPart
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.generation import FunctionTool, ToolCall

MAX_TOOLS = 128


class FunctionDefinition(StrictPart):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="The arguments' JSON schema; absent: no arguments."
    )
    strict: bool | None = Field(
        default=None,
        description="Accepted either way: a forced call always matches `parameters`, an "
        "`auto` call is parsed as the model wrote it.",
    )


class Tool(StrictPart):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(StrictPart):
    name: str


class NamedToolChoice(StrictPart):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(StrictPart):
    name: str = Field(min_length=1)
    arguments: str


class InputToolCall(StrictPart):
    """A call of an assistant turn in the history."""

    id: str = Field(min_length=1)
    type: Literal["function"]
    function: FunctionCall


@dataclass(frozen=True)
class ToolSelection:
    """What a request's tool fields ask of the generation."""

    tools: tuple[FunctionTool, ...]
    #: Parse calls out of the reply (`auto`, `required`, a named function).
    parse: bool
    parallel: bool
    #: The JSON schema of the one call decoding is constrained to; None: not forced.
    call_schema: str | None


def select_tools(
    tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool | None
) -> ToolSelection:
    """Check the tool fields together; raises `InvalidRequest` (400) naming the field."""
    if not tools:
        if choice not in (None, "none"):
            raise InvalidRequest("`tool_choice` needs `tools` to choose from", param="tool_choice")
        if parallel is not None:
            raise InvalidRequest("`parallel_tool_calls` needs `tools`", param="parallel_tool_calls")
        return ToolSelection((), parse=False, parallel=False, call_schema=None)
    names = [tool.function.name for tool in tools]
    if len(set(names)) != len(names):
        raise InvalidRequest("`tools` must name each function once", param="tools")
    if choice == "none":
        return ToolSelection((), parse=False, parallel=False, call_schema=None)
    functions = tuple(
        FunctionTool(
            name=tool.function.name,
            description=tool.function.description,
            parameters=tool.function.parameters or {"type": "object", "properties": {}},
        )
        for tool in tools
    )
    forced: tuple[FunctionTool, ...] = ()
    if choice == "required":
        forced = functions
    elif isinstance(choice, NamedToolChoice):
        forced = tuple(f for f in functions if f.name == choice.function.name)
        if not forced:
            raise InvalidRequest(
                f"`tool_choice.function.name` {choice.function.name!r} is not one of `tools`",
                param="tool_choice.function.name",
            )
    schema = _call_schema(forced) if forced else None
    return ToolSelection(functions, parse=True, parallel=parallel is not False, call_schema=schema)


def _call_schema(functions: tuple[FunctionTool, ...]) -> str:
    """One call of any of `functions`: `{"name": <its name>, "arguments": <its parameters>}`."""
    cases = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": f.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    return json.dumps(cases[0] if len(cases) == 1 else {"anyOf": cases})


def history_calls(calls: list[InputToolCall] | None) -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls or ()
    )


class _DropNone(BaseModel):
    """A delta part: fields it does not carry are left out, as OpenAI does."""

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class OutputFunction(BaseModel):
    name: str
    arguments: str


class OutputToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: OutputFunction

    @classmethod
    def of(cls, call: ToolCall) -> OutputToolCall:
        return cls(id=call.id, function=OutputFunction(name=call.name, arguments=call.arguments))


class FunctionDelta(_DropNone):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_DropNone):
    """A streamed call's change: the first carries its id, type and name (and `""`
    arguments), the rest fragments of its `arguments`."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta
