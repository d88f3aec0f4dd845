"""A Responses request, with the items of the chain it continues, as the chat path's request.

Items become chat turns (`instructions` a system turn first; a `function_call` joins the
assistant turn before it or opens one; a `function_call_output` is a `tool` turn), tools
and `tool_choice` take chat's shapes (a `namespace` group's functions are offered as
functions), `text.format` becomes `response_format`; then `ChatCompletionRequest` checks
and builds the `GenerationRequest`, so every bound, the tool grammar and the JSON grammar
are chat's own. Its errors name chat's fields: they are named again here as the Responses
request spells them (`messages.3.content` → `input.2.content`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from tokenrelay.api.openai.field_support import check_refused, set_with_no_effect
from tokenrelay.api.openai.schema import ChatCompletionRequest
from tokenrelay.api.responses.items import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionToolSpec,
    InputItem,
    MessageItem,
    NamespaceTool,
    UnservedChoice,
    UnservedItem,
    UnservedPart,
    UnservedTool,
)
from tokenrelay.api.responses.schema import (
    ResponseRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.settings import Settings, ToolCallParserName

#: Where a history item came from, in error messages.
HISTORY = "previous_response_id"
_UNSERVED_ITEMS = {
    "reasoning": "the served models do not reason",
    "item_reference": "item references are not implemented; send the items themselves",
}
_RENAMED = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "logprobs": "top_logprobs",
    "tool_choice.function.name": "tool_choice.name",
    "messages": "input",
}
_FIELD = re.compile(r"`([^`]+)`")


class Plan(BaseModel):
    """What rendering a response needs of its request, kept with a stored response so any
    API process renders it alike."""

    #: Parse tool calls out of the reply (tools offered and not `tool_choice: none`), with
    #: the model's parser (`api.jobs.tool_parser`), of these offered functions.
    parse_calls: bool = False
    parser: ToolCallParserName = "qwen"
    functions: list[str] = []
    parallel: bool = True
    #: Each function of a `namespace` group → the group's name.
    namespaces: dict[str, str] = {}
    logprobs: bool = False


@dataclass
class _Paths:
    """Where each chat turn, each of its calls, and each chat tool came from."""

    messages: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)

    def rename(self, param: str | None) -> str | None:
        if param is None:
            return None
        head, _, rest = param.partition(".")
        if head == "messages" and rest:
            index, _, tail = rest.partition(".")
            if tail.startswith("tool_calls."):
                return self.calls[int(index)][int(tail.split(".")[1])]
            path = self.messages[int(index)]
            return f"{path}.{tail}" if tail and path.startswith("input.") else path
        if head == "tools" and rest:
            index, _, tail = rest.partition(".")
            tail = tail.removeprefix("function").lstrip(".")
            return f"{self.tools[int(index)]}.{tail}" if tail else self.tools[int(index)]
        if head == "response_format":
            return "text.format"
        return _RENAMED.get(param, param)

    def restate(self, exc: InvalidRequest) -> InvalidRequest:
        """`exc` with its field named as the Responses request spells it."""
        names = {name: self.rename(name) or name for name in _FIELD.findall(exc.message)}
        message = _FIELD.sub(lambda match: f"`{names[match.group(1)]}`", exc.message)
        return type(exc)(message, param=self.rename(exc.param))


def build(
    request: ResponseRequest, history: list[InputItem], settings: Settings
) -> tuple[GenerationRequest, Plan]:
    """The generation a response runs, and its rendering plan; raises `InvalidRequest` (400)
    naming the Responses field."""
    check_refused(request)
    if request.text is not None:
        check_refused(request.text, prefix="text.")
    paths = _Paths()
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
        paths.messages.append("instructions")
        paths.calls.append([])
    for item in history:
        _add_item(messages, paths, item, HISTORY)
    items = request.input_items()
    for index, item in enumerate(items):
        _add_item(
            messages, paths, item, "input" if isinstance(request.input, str) else f"input.{index}"
        )
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    namespaces = _add_tools(body, paths, request)
    for name in ("temperature", "top_p", "service_tier"):
        if (value := getattr(request, name)) is not None:
            body[name] = value
    if request.max_output_tokens is not None:
        body["max_completion_tokens"] = request.max_output_tokens
    if request.top_logprobs is not None:
        body |= {"logprobs": True, "top_logprobs": request.top_logprobs}
    if request.stream_options is not None and request.stream_options.include_obfuscation:
        raise InvalidRequest(
            "`stream_options.include_obfuscation` is not supported: tokenrelay pads no stream "
            "events",
            param="stream_options.include_obfuscation",
        )
    if request.text is not None and not _format_overridden(request):
        body["response_format"] = _response_format(request)
    try:
        chat = ChatCompletionRequest.model_validate(body)
        generation = chat.to_generation(settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise paths.restate(InvalidRequest(f"`{where}`: {first.get('msg')}", param=where)) from None
    except InvalidRequest as exc:
        raise paths.restate(exc) from None
    if request.truncation is not None:
        generation = generation.model_copy(update={"truncate": request.truncation == "auto"})
    selection = chat.tool_selection() if "tools" in body else None
    plan = Plan(
        parse_calls=selection is not None and selection.parse,
        functions=[] if selection is None else [tool.name for tool in selection.tools],
        parallel=selection is None or selection.parallel,
        namespaces=namespaces,
        logprobs=request.top_logprobs is not None,
    )
    return generation, plan


def no_effect_fields(request: ResponseRequest) -> list[str]:
    """The fields `request` sets that change nothing, for the `x-tokenrelay-no-effect`
    header: those declared so, and a JSON `text.format` beside a forced call (the reply is
    the call: there is no text to shape, as with OpenAI; the Agents SDK sends both for an
    agent with an output type and a forced tool)."""
    fields = set_with_no_effect(request)
    if _format_overridden(request):
        fields.append("text.format")
    return fields


def _format_overridden(request: ResponseRequest) -> bool:
    forced = request.tools and (
        request.tool_choice == "required" or isinstance(request.tool_choice, FunctionChoice)
    )
    text_format = request.text.format if request.text is not None else None
    return bool(forced) and isinstance(text_format, TextFormatJsonObject | TextFormatJsonSchema)


def _add_item(messages: list[dict[str, Any]], paths: _Paths, item: InputItem, path: str) -> None:
    match item:
        case MessageItem(role=role):
            _check_parts(item.content, path, "content")
            messages.append({"role": role, "content": item.text()})
            paths.messages.append(path)
            paths.calls.append([])
        case FunctionCallItem(call_id=call_id, name=name, arguments=arguments):
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                paths.messages.append(path)
                paths.calls.append([])
            paths.calls[-1].append(path)
        case FunctionCallOutputItem(call_id=call_id):
            _check_parts(item.output, path, "output")
            messages.append({"role": "tool", "content": item.text(), "tool_call_id": call_id})
            paths.messages.append(path)
            paths.calls.append([])
        case UnservedItem(type=kind):
            reason = _UNSERVED_ITEMS.get(kind, "built-in tools and their calls are not served")
            raise InvalidRequest(
                f"`{path}.type` {kind!r} is not supported by tokenrelay ({reason}); it is "
                "refused rather than ignored",
                param=f"{path}.type",
            )


def _check_parts(content: object, path: str, name: str) -> None:
    if not isinstance(content, list):
        return
    for index, part in enumerate(content):
        if isinstance(part, UnservedPart):
            where = f"{path}.{name}.{index}.type"
            raise InvalidRequest(
                f"`{where}` {part.type!r} is not supported by tokenrelay (the served models "
                "read text only: `input_text`, `output_text`); it is refused rather than "
                "ignored",
                param=where,
            )


def _add_tools(body: dict[str, Any], paths: _Paths, request: ResponseRequest) -> dict[str, str]:
    """Chat's `tools`, `tool_choice` and `parallel_tool_calls` in `body`; returns each
    namespaced function's group."""
    tools: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    for index, tool in enumerate(request.tools or []):
        match tool:
            case FunctionToolSpec():
                tools.append(_chat_tool(tool))
                paths.tools.append(f"tools.{index}")
            case NamespaceTool(name=group, tools=functions):
                for inner, function in enumerate(functions):
                    tools.append(_chat_tool(function))
                    paths.tools.append(f"tools.{index}.tools.{inner}")
                    namespaces[function.name] = group
            case UnservedTool(type=kind):
                raise InvalidRequest(
                    f"`tools.{index}.type` {kind!r} is not supported by tokenrelay (it runs no "
                    "built-in tools; offer functions); it is refused rather than ignored",
                    param=f"tools.{index}.type",
                )
    choice = request.tool_choice
    if isinstance(choice, UnservedChoice):
        raise InvalidRequest(
            f"`tool_choice.type` {choice.type!r} is not supported by tokenrelay (only `none`, "
            "`auto`, `required` or a function); it is refused rather than ignored",
            param="tool_choice.type",
        )
    if not tools:
        if choice not in (None, "none", "auto"):  # `none`/`auto` of nothing: nothing to do
            raise InvalidRequest("`tool_choice` needs `tools` to choose from", param="tool_choice")
        return namespaces
    body["tools"] = tools
    if isinstance(choice, FunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        body["tool_choice"] = choice
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    return namespaces


def _chat_tool(tool: FunctionToolSpec) -> dict[str, Any]:
    function = tool.model_dump(exclude={"type"}, exclude_none=True)
    return {"type": "function", "function": function}


def _response_format(request: ResponseRequest) -> dict[str, Any]:
    assert request.text is not None
    match request.text.format:
        case TextFormatJsonSchema() as spec:
            schema = spec.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)
            return {"type": "json_schema", "json_schema": schema}
        case TextFormatJsonObject():
            return {"type": "json_object"}
    return {"type": "text"}
