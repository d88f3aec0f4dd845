"""`api.anthropic.schema`: an Anthropic Messages request becomes the chat path's request, with
what it cannot express refused under its own field names, and what has no effect named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tokenrelay.api.anthropic.schema import CountTokensRequest, MessagesRequest
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.generation import ChatMessage, GenerationRequest, ToolCall
from tokenrelay.shared.settings import Settings

SETTINGS = Settings()
WEATHER = {
    "name": "get_weather",
    "description": "The weather.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def body(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    } | fields


def generation(**fields: Any) -> GenerationRequest:
    return MessagesRequest.model_validate(body(**fields)).to_chat().to_generation(SETTINGS)


def refusal(**fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        generation(**fields)
    return caught.value


def test_the_sampling_fields_reach_the_generation() -> None:
    request = generation(stop_sequences=["END", "\n\n"], temperature=0.3, top_p=0.9, top_k=7)
    assert request.model == "m"
    assert request.max_tokens == 64
    assert request.stop == ("END", "\n\n")
    assert (request.temperature, request.top_p, request.top_k) == (0.3, 0.9, 7)
    assert request.messages == (ChatMessage(role="user", content="hi"),)


def test_system_blocks_and_system_role_messages_fold_into_one_system_turn_first() -> None:
    request = generation(
        system=[
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Be brief."},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
            {"role": "system", "content": "Today is Monday."},
        ],
    )
    assert request.messages == (
        ChatMessage(role="system", content="You are Claude Code.\n\nBe brief.\n\nToday is Monday."),
        ChatMessage(role="user", content="hello"),
    )


def test_tool_use_and_tool_result_blocks_become_the_chats_calls_and_tool_turns() -> None:
    request = generation(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "sunny"}],
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
    )
    call = ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}')
    assert request.messages[1:] == (
        ChatMessage(role="assistant", content="Looking.", tool_calls=(call,)),
        ChatMessage(role="tool", content="sunny", tool_call_id="toolu_1"),
        ChatMessage(role="user", content="and tomorrow?"),
    )
    assert [tool.name for tool in request.tools] == ["get_weather"]
    assert request.tools[0].parameters == WEATHER["input_schema"]
    assert request.json_schema is None


@pytest.mark.parametrize(
    ("choice", "forced"),
    [
        ({"type": "any"}, True),
        ({"type": "tool", "name": "get_weather"}, True),
        ({"type": "auto"}, False),
    ],
)
def test_any_and_a_named_tool_constrain_decoding_to_one_call(
    choice: dict[str, Any], forced: bool
) -> None:
    request = generation(tools=[WEATHER], tool_choice=choice)
    assert request.tool_call is forced
    if forced:
        schema = json.loads(request.json_schema or "")
        assert schema["properties"]["name"] == {"const": "get_weather"}
        assert schema["properties"]["arguments"] == WEATHER["input_schema"]


def test_tool_choice_none_offers_no_tools_and_parallel_use_can_be_disabled() -> None:
    assert generation(tools=[WEATHER], tool_choice={"type": "none"}).tools == ()
    chat = MessagesRequest.model_validate(
        body(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    ).to_chat()
    assert chat.tool_selection().parallel is False
    assert chat.tool_selection().parse is True


def test_an_output_format_is_the_json_grammar() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    request = generation(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert json.loads(request.json_schema or "") == schema
    assert request.tool_call is False


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "auto", "name": "get_weather"}},
            "tool_choice.name",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "none", "disable_parallel_tool_use": True},
            },
            "tool_choice.disable_parallel_tool_use",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "any"},
                "output_config": {"format": {"type": "json_schema", "schema": {}}},
            },
            "output_config.format",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
        ({"tools": [WEATHER | {"defer_loading": True}]}, "tools.0.defer_loading"),
        ({"container": "c1"}, "container"),
        ({"mcp_servers": [{"type": "url"}]}, "mcp_servers"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages.0.content.0",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "x", "citations": []}]}
                ]
            },
            "messages.0.content.0.citations",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
                    }
                ]
            },
            "messages.0.content.0",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
                    {"role": "user", "content": "go"},
                ]
            },
            "messages.1.content.0",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image"}],
                            }
                        ],
                    }
                ]
            },
            "messages.0.content.0.content.0",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "system", "content": [{"type": "image"}]},
                ]
            },
            "messages.1.content.0",
        ),
        ({"messages": [{"role": "user", "content": ""}]}, "messages.0.content"),
        ({"messages": [{"role": "system", "content": "only a system prompt"}]}, "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "The answer is"},
                ]
            },
            "messages.1",
        ),
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages.0.content"),
        ({"tools": [WEATHER | {"description": "\udfff"}]}, "tools.0.description"),
    ],
)
def test_what_cannot_be_expressed_is_a_400_under_anthropics_name(
    fields: dict[str, Any], param: str
) -> None:
    error = refusal(**fields)
    assert error.param == param, error.message
    assert f"`{param}" in error.message


def test_an_unimplemented_block_says_why() -> None:
    image = [{"type": "image", "source": {"type": "base64", "data": "", "media_type": "image/png"}}]
    error = refusal(messages=[{"role": "user", "content": image}])
    assert "read text only" in error.message
    assert "refused rather than ignored" in error.message
    server = refusal(tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}])
    assert "web_search_20250305" in server.message


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 0},
        {"temperature": 1.5},
        {"top_k": -1},
        {"speed": "fast"},
        {"service_tier": "priority"},
        {"tools": [WEATHER | {"name": "has space"}]},
        {"tool_choice": {"type": "required"}},
        {"metadata": {"user_id": "u", "team": "x"}},
        {"system": [{"type": "image"}]},
        {"colour": "blue"},
    ],
)
def test_a_malformed_field_is_a_schema_error(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate(body(**fields))


def test_claude_codes_defaults_are_accepted_and_named_as_no_effect() -> None:
    cached = {"cache_control": {"type": "ephemeral"}}
    request = MessagesRequest.model_validate(
        body(
            system=[{"type": "text", "text": "You are Claude Code."} | cached],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "hello"} | cached]},
                {"role": "system", "content": "A reminder."},
            ],
            tools=[WEATHER | cached],
            thinking={"type": "adaptive", "budget_hint": "any key"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            output_config={"effort": "high"},
            metadata={"user_id": "user_abc_session_1"},
            max_tokens=200,
            stream=True,
        )
    )
    assert request.no_effect_fields() == [
        "thinking",
        "context_management",
        "metadata",
        "output_config.effort",
        "system.*.cache_control",
        "messages.*.content.*.cache_control",
        "tools.*.cache_control",
    ]
    assert request.to_chat().to_generation(SETTINGS).messages[0].role == "system"


def test_a_request_without_no_effect_fields_names_none() -> None:
    assert (
        MessagesRequest.model_validate(body(metadata=None, thinking=None)).no_effect_fields() == []
    )


def test_a_count_request_renders_the_same_prompt_as_its_message() -> None:
    fields = body(system="Be brief.", tools=[WEATHER], tool_choice={"type": "auto"})
    message = MessagesRequest.model_validate(fields).to_chat().to_generation(SETTINGS)
    del fields["max_tokens"]
    count = CountTokensRequest.model_validate(fields).to_chat().to_generation(SETTINGS)
    assert (count.messages, count.tools) == (message.messages, message.tools)
