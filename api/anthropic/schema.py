"""Anthropic's Messages API request bodies (`POST /v1/messages` and `.../count_tokens`), and
their validation into the chat path's request.

A Messages request becomes the equivalent chat completion request (`to_chat`), which the
chat path validates into its `GenerationRequest` and tool selection as for
`/v1/chat/completions`: the same bounds, the same tool rendering and call parsing, the same
grammar for a forced call (`tool_choice` `any` or `tool`) or a JSON output
(`output_config.format`). What the chat request would refuse under its own names is checked
here first, under Anthropic's.

The conversation: `system` and every `system`-role message of `messages` (Claude Code sends
one) are folded into one system turn at the start; a user turn's `tool_result` blocks become
the chat's tool turns, an assistant turn's `tool_use` blocks its calls; the text blocks of one
turn are joined a blank line apart. A last turn by the assistant (prefill) is refused: the
reply always starts a new turn.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from tokenrelay.api.anthropic.blocks import (
    CACHE_CONTROL,
    SERVER_TOOLS_REFUSED,
    AnyToolParam,
    ContentBlockParam,
    OtherBlockParam,
    ServerToolParam,
    TextBlockParam,
    ToolChoiceParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    join,
)
from tokenrelay.api.openai.field_support import (
    StrictPart,
    check_refused,
    no_effect,
    refused,
    set_with_no_effect,
)
from tokenrelay.api.openai.schema import MAX_STOP_STRINGS, ChatCompletionRequest
from tokenrelay.api.openai.tools import MAX_TOOLS
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.redis.rq_jobs import Priority

_NO_THINKING = "the served models do not think in blocks of their own"
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


class MessageParam(StrictPart):
    role: Literal["user", "assistant", "system"] = Field(
        description="`system`: folded into the system prompt (Claude Code sends one)."
    )
    content: str | list[ContentBlockParam]


class MetadataParam(StrictPart):
    user_id: str | None = None


class JSONOutputFormatParam(StrictPart):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfigParam(StrictPart):
    effort: str | None = no_effect("the served models do not reason, so spend no effort on it")
    format: JSONOutputFormatParam | None = Field(
        default=None,
        description="The reply is JSON matching `schema`, enforced while decoding (the chat "
        "path's grammar).",
    )


class CountTokensRequest(StrictPart):
    """The body of `POST /v1/messages/count_tokens`: what shapes the prompt."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlockParam] | None = None
    tools: list[AnyToolParam] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="Custom tools, offered to the model as functions (the chat template's "
        "format); server tools are refused.",
    )
    tool_choice: ToolChoiceParam | None = None
    output_config: OutputConfigParam | None = None
    thinking: dict[str, Any] | None = no_effect(_NO_THINKING)
    context_management: dict[str, Any] | None = no_effect(
        "Anthropic's server-side clearing of old turns; the conversation is run as sent"
    )
    cache_control: dict[str, Any] | None = no_effect(CACHE_CONTROL)
    speed: Literal["standard"] | None = Field(
        default=None, description="Only `standard`: there is one speed."
    )
    mcp_servers: Any = refused("tokenrelay connects to no MCP servers")
    user_profile_id: Any = refused("there are no user profiles")
    workspace_id: Any = refused("there are no workspaces")

    def to_chat(self) -> ChatCompletionRequest:
        """The equivalent chat completion request; raises `InvalidRequest` (400) naming the
        field of this request that it cannot express."""
        check_refused(self)
        _check_unicode(self.model_dump(by_alias=True, exclude_none=True), "")
        fields = {
            "model": self.model,
            "messages": self._chat_messages(),
            **self._tools(),
            **self._output(),
            **self._sampling(),
        }
        return ChatCompletionRequest.model_validate(fields)

    def no_effect_fields(self) -> list[str]:
        """The no-effect fields this request sets, each named once (`*` for any index)."""
        found = set_with_no_effect(self)
        if self.output_config is not None:
            found += set_with_no_effect(self.output_config, "output_config.")
        for text in self.system if isinstance(self.system, list) else []:
            found += set_with_no_effect(text, "system.*.")
        for message in self.messages:
            for block in message.content if isinstance(message.content, list) else []:
                found += set_with_no_effect(block, "messages.*.content.*.")
                if isinstance(block, ToolResultBlockParam) and isinstance(block.content, list):
                    for part in block.content:
                        found += set_with_no_effect(part, "messages.*.content.*.content.*.")
        for tool in self.tools or []:
            found += set_with_no_effect(tool, "tools.*.")
        return list(dict.fromkeys(found))

    def _sampling(self) -> dict[str, Any]:
        """A count needs no sampling: the prompt is the same whatever is generated."""
        return {"max_tokens": 1}

    def _chat_messages(self) -> list[dict[str, Any]]:
        system = [] if self.system is None else [_system_text(self.system, "system")]
        turns: list[dict[str, Any]] = []
        for i, message in enumerate(self.messages):
            field = f"messages.{i}"
            if message.role == "system":
                system.append(_system_text(message.content, f"{field}.content"))
            elif message.role == "user":
                turns += _user_turns(message.content, field)
            else:
                turns.append(_assistant_turn(message.content, field))
        if not turns:
            raise InvalidRequest("`messages` must hold a user message", param="messages")
        if turns[-1]["role"] == "assistant":
            last = len(self.messages) - 1
            raise InvalidRequest(
                f"`messages.{last}`: a last assistant turn (prefill) is not supported: the "
                "reply always starts a new turn",
                param=f"messages.{last}",
            )
        prompt = join(text for text in system if text)
        return ([{"role": "system", "content": prompt}] if prompt else []) + turns

    def _tools(self) -> dict[str, Any]:
        choice = self.tool_choice
        if not self.tools:
            if choice is not None and choice.type != "none":
                raise InvalidRequest(
                    "`tool_choice` needs `tools` to choose from", param="tool_choice"
                )
            return {}
        functions = [_function(tool, f"tools.{i}") for i, tool in enumerate(self.tools)]
        names = [function["function"]["name"] for function in functions]
        if len(set(names)) != len(names):
            raise InvalidRequest("`tools` must name each tool once", param="tools")
        out: dict[str, Any] = {"tools": functions}
        if choice is None:
            return out
        if (choice.name is None) == (choice.type == "tool"):
            raise InvalidRequest(
                "`tool_choice.name` is required with `type: tool` and only there",
                param="tool_choice.name",
            )
        if choice.type == "tool" and choice.name not in names:
            raise InvalidRequest(
                f"`tool_choice.name` {choice.name!r} is not one of `tools`",
                param="tool_choice.name",
            )
        if choice.type == "none" and choice.disable_parallel_tool_use is not None:
            raise InvalidRequest(
                "`tool_choice.disable_parallel_tool_use` goes with `auto`, `any` or `tool`",
                param="tool_choice.disable_parallel_tool_use",
            )
        named = {"type": "function", "function": {"name": choice.name}}
        out["tool_choice"] = _CHOICES.get(choice.type, named)
        if choice.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
        return out

    def _output(self) -> dict[str, Any]:
        output = self.output_config.format if self.output_config is not None else None
        if output is None:
            return {}
        if self.tools and self.tool_choice is not None and self.tool_choice.type in ("any", "tool"):
            raise InvalidRequest(
                "`output_config.format` cannot be combined with a forced `tool_choice`: the "
                "reply is the tool call",
                param="output_config.format",
            )
        spec = {"name": "output", "schema": output.schema_}
        return {"response_format": {"type": "json_schema", "json_schema": spec}}


class MessagesRequest(CountTokensRequest):
    """The body of `POST /v1/messages`."""

    max_tokens: int = Field(
        ge=1, description="Past the context window (prompt included) or the limits: a 400."
    )
    stop_sequences: list[str] | None = Field(
        default=None,
        description=f"At most {MAX_STOP_STRINGS}; the reply ends before the first one it "
        'writes, with `stop_reason: "stop_sequence"` and `stop_sequence` naming it.',
    )
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(
        default=None, ge=0, description="Sample from the k likeliest tokens; 0: all."
    )
    stream: bool = False
    metadata: MetadataParam | None = no_effect("Anthropic's end-user id for abuse monitoring")
    service_tier: Literal["auto", "standard_only"] | None = Field(
        default=None, description="Either: there is one tier."
    )
    priority: Priority | None = Field(
        default=None, description="tokenrelay's: the job's queue (default: the key's)."
    )
    container: Any = refused("there are no code execution containers")
    inference_geo: Any = refused("inference runs where the cluster's workers are")
    diagnostics: Any = refused("prompt cache diagnostics are not implemented")

    def _sampling(self) -> dict[str, Any]:
        stops = self.stop_sequences or []
        if len(stops) > MAX_STOP_STRINGS:
            raise InvalidRequest(
                f"`stop_sequences` takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}",
                param="stop_sequences",
            )
        if any(not stop for stop in stops):
            raise InvalidRequest(
                "`stop_sequences` must not be empty strings", param="stop_sequences"
            )
        return {
            "max_tokens": self.max_tokens,
            "stop": stops or None,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "priority": self.priority,
        }


def _system_text(content: str | list[TextBlockParam] | list[ContentBlockParam], field: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content):
        if not isinstance(block, TextBlockParam):
            raise InvalidRequest(
                f"`{field}.{j}`: a system prompt holds text blocks only", param=f"{field}.{j}"
            )
        check_refused(block, prefix=f"{field}.{j}.")
        texts.append(block.text)
    return join(texts)


def _user_turns(content: str | list[ContentBlockParam], field: str) -> list[dict[str, Any]]:
    """The chat turns of one user message: its tool results as tool turns, its text as a
    user turn, in the message's order."""
    blocks = [TextBlockParam(type="text", text=content)] if isinstance(content, str) else content
    turns: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        where = f"{field}.content" if isinstance(content, str) else f"{field}.content.{j}"
        _check_block(block, where, allowed=(TextBlockParam, ToolResultBlockParam), role="user")
        if isinstance(block, TextBlockParam):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlockParam):
            if texts:
                turns.append({"role": "user", "content": join(texts)})
                texts = []
            parts = block.content if isinstance(block.content, list) else []
            for k, part in enumerate(parts):
                _check_block(part, f"{where}.content.{k}", (TextBlockParam,), "tool_result")
            result = {"role": "tool", "content": block.text(), "tool_call_id": block.tool_use_id}
            turns.append(result)
    if texts and join(texts):
        turns.append({"role": "user", "content": join(texts)})
    if not turns:
        raise InvalidRequest(
            f"`{field}.content` must hold some text or a `tool_result` block",
            param=f"{field}.content",
        )
    return turns


def _assistant_turn(content: str | list[ContentBlockParam], field: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for j, block in enumerate(content):
        _check_block(
            block, f"{field}.content.{j}", (TextBlockParam, ToolUseBlockParam), "assistant"
        )
        if isinstance(block, TextBlockParam):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlockParam):
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
    return {"role": "assistant", "content": join(texts), "tool_calls": calls or None}


def _check_block(
    block: ContentBlockParam | TextBlockParam | OtherBlockParam,
    field: str,
    allowed: tuple[type, ...],
    role: str,
) -> None:
    """Refuse a block tokenrelay does not implement, or one out of its place."""
    if isinstance(block, OtherBlockParam):
        raise InvalidRequest(
            f"`{field}` (a `{block.type}` block) is not supported by tokenrelay "
            f"({block.refusal()}); it is refused rather than ignored",
            param=field,
        )
    if not isinstance(block, allowed):
        raise InvalidRequest(
            f"`{field}`: a `{block.type}` block does not belong in a {role} turn", param=field
        )
    check_refused(block, prefix=f"{field}.")


def _function(tool: ToolParam | ServerToolParam, field: str) -> dict[str, Any]:
    if isinstance(tool, ServerToolParam):
        raise InvalidRequest(
            f"`{field}` (the server tool `{tool.type}`) is not supported by tokenrelay "
            f"({SERVER_TOOLS_REFUSED}); it is refused rather than ignored",
            param=field,
        )
    check_refused(tool, prefix=f"{field}.")
    function = {"name": tool.name, "description": tool.description}
    return {"type": "function", "function": function | {"parameters": tool.input_schema}}


def _check_unicode(value: object, field: str) -> None:
    """JSON's `\\ud800` escapes decode to lone surrogates, which no tokenizer or UTF-8 takes."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidRequest(
                f"`{field}` is not valid Unicode: a lone surrogate at character {exc.start}",
                param=field,
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, field or "body")  # names the object whose key it is
            _check_unicode(item, f"{field}.{key}" if field else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_unicode(item, f"{field}.{index}")
