"""`api.responses.conversation`: a Responses request as the chat path's generation (items as
turns, tools and namespaces as functions, `text.format` as the JSON grammar), and its 400s
naming the field as the Responses request spells it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenrelay.api.openai.field_support import NO_EFFECT, SUPPORT_KEY, set_with_no_effect
from tokenrelay.api.responses.conversation import Plan, build, no_effect_fields
from tokenrelay.api.responses.items import ITEMS, stored_items
from tokenrelay.api.responses.objects import Echo
from tokenrelay.api.responses.schema import ResponseRequest
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.generation import ChatMessage, GenerationRequest, ToolCall
from tokenrelay.shared.settings import Settings

SETTINGS = Settings(max_tokens_limit=1000, default_max_tokens=100)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def convert(
    history: list[dict[str, Any]] | None = None, **fields: Any
) -> tuple[GenerationRequest, Plan]:
    request = ResponseRequest.model_validate({"model": "m", **fields})
    return build(request, ITEMS.validate_python(history or []), SETTINGS)


def refused(param: str, **fields: Any) -> str:
    with pytest.raises(InvalidRequest) as caught:
        convert(**fields)
    assert caught.value.param == param, caught.value.message
    assert f"`{param}`" in caught.value.message
    return caught.value.message


def test_a_string_input_is_one_user_turn_after_the_instructions() -> None:
    generation, plan = convert(input="hi", instructions="be brief", max_output_tokens=7)
    assert generation.messages == (
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="hi"),
    )
    assert generation.max_tokens == 7
    assert plan == Plan()


def test_items_become_turns_a_call_joins_the_assistant_turn_before_it() -> None:
    generation, _ = convert(
        input=[
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "let me see"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
            {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
        ]
    )
    assert generation.messages == (
        ChatMessage(role="system", content="rules"),
        ChatMessage(role="user", content="q"),
        ChatMessage(
            role="assistant",
            content="let me see",
            tool_calls=(
                ToolCall(id="c1", name="f", arguments="{}"),
                ToolCall(id="c2", name="g", arguments="{}"),
            ),
        ),
        ChatMessage(role="tool", content="one", tool_call_id="c1"),
        ChatMessage(role="tool", content="two", tool_call_id="c2"),
        ChatMessage(
            role="assistant", content="", tool_calls=(ToolCall(id="c3", name="f", arguments="{}"),)
        ),
    )


def test_history_comes_before_the_input_and_instructions_before_both() -> None:
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]},
        {
            "id": "msg_x_0",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "answer", "annotations": [], "logprobs": []}
            ],
        },
    ]
    generation, _ = convert(history, input="second", instructions="now")
    assert [(m.role, m.content) for m in generation.messages] == [
        ("system", "now"),
        ("user", "first"),
        ("assistant", "answer"),
        ("user", "second"),
    ]


def test_namespaced_functions_are_offered_as_functions() -> None:
    namespace = {"type": "namespace", "name": "mcp", "description": "d", "tools": [WEATHER]}
    generation, plan = convert(input="hi", tools=[namespace], tool_choice="auto")
    assert [tool.name for tool in generation.tools] == ["get_weather"]
    assert plan.parse_calls and plan.namespaces == {"get_weather": "mcp"}


def test_a_named_tool_choice_forces_one_call_by_the_chat_paths_grammar() -> None:
    generation, plan = convert(
        input="hi", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}
    )
    assert generation.tool_call
    assert generation.json_schema is not None
    assert json.loads(generation.json_schema)["properties"]["name"] == {"const": "get_weather"}
    assert plan.parse_calls


def test_text_format_json_schema_is_the_json_grammar() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    generation, _ = convert(
        input="hi", text={"format": {"type": "json_schema", "name": "n", "schema": schema}}
    )
    assert generation.json_schema is not None
    assert json.loads(generation.json_schema) == schema
    plain, _ = convert(input="hi", text={"format": {"type": "text"}})
    assert plain.json_schema is None


@pytest.mark.parametrize(
    ("truncation", "truncate"), [("auto", True), ("disabled", False), (None, None)]
)
def test_truncation_sets_the_generations_choice(
    truncation: str | None, truncate: bool | None
) -> None:
    generation, _ = convert(input="hi", truncation=truncation)
    assert generation.truncate is truncate
    assert generation.truncating(default=True) is (True if truncate is None else truncate)


def test_a_json_format_beside_a_forced_call_has_no_effect_and_is_named() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_object"}},
    }
    request = ResponseRequest.model_validate(body)
    generation, _ = build(request, [], SETTINGS)
    assert generation.tool_call  # the grammar is the call's
    assert json.loads(generation.json_schema or "{}")["properties"]["name"] == {
        "const": "get_weather"
    }
    assert no_effect_fields(request) == ["text.format"]
    request = ResponseRequest.model_validate(body | {"tool_choice": "auto"})
    generation, _ = build(request, [], SETTINGS)
    assert not generation.tool_call and no_effect_fields(request) == []


def test_top_logprobs_asks_the_job_for_log_probabilities() -> None:
    generation, plan = convert(input="hi", top_logprobs=3)
    assert generation.logprobs == 3 and plan.logprobs


@pytest.mark.parametrize(
    ("param", "fields"),
    [
        ("max_output_tokens", {"input": "hi", "max_output_tokens": 1001}),
        ("input.0.content", {"input": [{"role": "user", "content": ""}]}),
        ("input", {"input": []}),
        (
            "input.1.type",
            {"input": [{"role": "user", "content": "x"}, {"type": "reasoning", "summary": []}]},
        ),
        ("input.0.type", {"input": [{"type": "item_reference", "id": "msg_1"}]}),
        (
            "input.0.content.1.type",
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_image", "image_url": "x"},
                        ],
                    }
                ]
            },
        ),
        ("tools.0.type", {"input": "hi", "tools": [{"type": "web_search"}]}),
        (
            "tool_choice.type",
            {"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "web_search_preview"}},
        ),
        (
            "tool_choice.name",
            {
                "input": "hi",
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "name": "nope"},
            },
        ),
        ("tool_choice", {"input": "hi", "tool_choice": "required"}),
        ("text.verbosity", {"input": "hi", "text": {"verbosity": "low"}}),
        ("conversation", {"input": "hi", "conversation": "conv_1"}),
        (
            "stream_options.include_obfuscation",
            {"input": "hi", "stream_options": {"include_obfuscation": True}},
        ),
    ],
)
def test_a_refused_or_bad_field_is_a_400_naming_the_responses_field(
    param: str, fields: dict[str, Any]
) -> None:
    refused(param, **fields)


def test_codex_clis_default_fields_are_accepted_with_no_effect_and_named() -> None:
    body = {
        "model": "m",
        "input": [{"role": "developer", "content": "x"}, {"role": "user", "content": "hello"}],
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "prompt_cache_key": "k",
        "client_metadata": {"a": "b"},
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": [WEATHER]}],
    }
    request = ResponseRequest.model_validate(body)
    build(request, [], SETTINGS)
    assert sorted(set_with_no_effect(request)) == [
        "client_metadata",
        "include",
        "prompt_cache_key",
        "reasoning",
    ]
    schema = ResponseRequest.model_json_schema()["properties"]
    assert schema["reasoning"][SUPPORT_KEY] == NO_EFFECT
    assert schema["include"][SUPPORT_KEY] == NO_EFFECT


def test_stored_items_get_ids_and_text_parts() -> None:
    request = ResponseRequest.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "q"},
                {"type": "function_call_output", "call_id": "c", "output": "o", "id": "mine"},
            ],
        }
    )
    assert stored_items(request.input_items(), "j") == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "q"}],
            "id": "msg_j_in0",
            "status": "completed",
        },
        {
            "type": "function_call_output",
            "call_id": "c",
            "output": "o",
            "id": "mine",
            "status": "completed",
        },
    ]


def test_the_echo_fills_openais_defaults() -> None:
    echo = Echo.of(ResponseRequest.model_validate({"model": "m", "input": "x", "store": False}))
    assert (echo.store, echo.background, echo.tool_choice, echo.truncation) == (
        False,
        False,
        "auto",
        "disabled",
    )
    assert echo.text.format == {"type": "text"}
