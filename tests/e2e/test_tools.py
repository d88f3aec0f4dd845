"""Function calling through real processes (`tokenrelay api`, `tokenrelay worker`, the tiny
model) with the `openai` package: forced calls (named and `required`) are valid JSON for the
function's parameters even from random weights, streamed as OpenAI's `tool_calls` deltas;
`auto` and `none` render the tools or not; history with calls and tool results renders
back; stop words still end a ReAct turn when tools are also sent; bad tool fields are 400s."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory

MESSAGES: list[Any] = [{"role": "user", "content": "what is the weather in Paris?"}]


class Weather(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)


class Clock(BaseModel):
    zone: Literal["UTC", "CET"]


def tool(name: str, model: type[BaseModel]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name}.",
            "parameters": model.model_json_schema(),
        },
    }


TOOLS = [tool("get_weather", Weather), tool("get_time", Clock)]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    # Token by token (no coalescing), so a streamed call's arguments arrive in fragments.
    return make_module_cluster(
        {"TOKENRELAY_MAX_INFLIGHT": "8", "TOKENRELAY_FLUSH_INTERVAL_MS": "0"}
    )


def forced(client: openai.OpenAI, seed: int, **fields: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=1.2,
        seed=seed,
        max_tokens=200,
        **fields,
    )


def test_a_named_tool_choice_is_always_a_valid_call_of_that_function(
    client: openai.OpenAI,
) -> None:
    for seed in range(3):
        choice = forced(client, seed, tool_choice=NAMED).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather"
        Weather.model_validate_json(call.function.arguments)


def test_required_streams_tool_call_deltas_that_add_up_to_the_same_call(
    client: openai.OpenAI,
) -> None:
    whole = forced(client, 7, tool_choice="required").choices[0]
    (call,) = whole.message.tool_calls
    starts, fragments, finish, content = [], [], None, ""
    for chunk in forced(client, 7, tool_choice="required", stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            assert delta.index == 0
            if delta.id is not None:
                starts.append((delta.id, delta.function.name))
            fragments.append(delta.function.arguments)
        finish = choice.finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert len(starts) == 1 and starts[0][0].startswith("call_")
    assert starts[0][1] == call.function.name in ("get_weather", "get_time")
    assert len(fragments) > 2, "arguments arrive in fragments as they are generated"
    assert "".join(fragments) == call.function.arguments
    model = Weather if call.function.name == "get_weather" else Clock
    model.model_validate_json(call.function.arguments)


def test_the_sdk_stream_helper_accumulates_the_forced_call(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice=NAMED,  # type: ignore[arg-type]
        temperature=1.2,
        seed=3,
        max_tokens=200,
    ) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    Weather.model_validate_json(call.function.arguments)  # type: ignore[union-attr]


def prompt_tokens(client: openai.OpenAI, **fields: Any) -> int:
    fields.setdefault("messages", MESSAGES)
    reply = client.chat.completions.create(model=MODEL_NAME, max_tokens=4, temperature=0, **fields)
    assert reply.usage is not None
    return reply.usage.prompt_tokens


def test_auto_renders_the_tools_in_the_prompt_and_none_does_not(client: openai.OpenAI) -> None:
    plain = prompt_tokens(client)
    auto = prompt_tokens(client, tools=TOOLS)
    assert auto > plain + 50
    assert prompt_tokens(client, tools=TOOLS, tool_choice="none") == plain
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, max_tokens=30, temperature=0
    )
    choice = reply.choices[0]
    # random weights write no `<tool_call>`: the reply is text, as without tools
    assert isinstance(choice.message.content, str) and choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    streamed, finish = "", None
    for chunk in client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, max_tokens=30, temperature=0, stream=True
    ):
        assert not chunk.choices[0].delta.tool_calls
        streamed += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (streamed, finish) == (choice.message.content, choice.finish_reason)


def test_calls_and_tool_results_in_the_history_render_back(client: openai.OpenAI) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    longer = [
        *history[:2],
        {**history[2], "content": "sunny, 21 degrees, light wind from the west"},
    ]
    short = prompt_tokens(client, messages=history, tools=TOOLS)
    assert prompt_tokens(client, messages=longer, tools=TOOLS) > short
    assert short > prompt_tokens(client, tools=TOOLS) + 10


def test_stop_words_still_end_a_react_turn_when_tools_are_sent(client: openai.OpenAI) -> None:
    react = [{"role": "user", "content": "Question: weather in Paris?\nThought:"}]
    fields: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": react,
        "tools": TOOLS,
        "max_tokens": 40,
        "temperature": 1.0,
        "seed": 11,
    }
    full = client.chat.completions.create(**fields)
    text = full.choices[0].message.content or ""
    stop_word = text[12:16]
    assert stop_word.strip(), f"greedy text too short to pick a stop word from: {text!r}"
    cut = client.chat.completions.create(**fields, stop=[stop_word])
    choice = cut.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == text[: text.index(stop_word)]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"tools": TOOLS, "tool_choice": "required", "min_tokens": 3}, "min_tokens"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
            "messages.0.tool_call_id",
        ),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_bad_tool_fields_are_a_400_naming_the_field(
    cluster: Cluster, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL_NAME, "messages": MESSAGES, **fields}
    response = httpx.post(f"{cluster.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_jobs_tools_are_refused_and_a_schema_that_cannot_be_enforced_too(
    cluster: Cluster,
) -> None:
    body = {"model": MODEL_NAME, "messages": MESSAGES, "tools": TOOLS}
    response = httpx.post(f"{cluster.base_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools"
    bad = tool("get_weather", Weather)
    bad["function"]["parameters"] = {"type": "object", "properties": {"a": {"type": "nonsense"}}}
    body = {"model": MODEL_NAME, "messages": MESSAGES, "tools": [bad], "tool_choice": "required"}
    response = httpx.post(f"{cluster.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert (
        "`tools` has a JSON schema that cannot be enforced" in response.json()["error"]["message"]
    )


def test_tool_call_deltas_have_openais_exact_shape(cluster: Cluster) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": NAMED,
        "temperature": 1.2,
        "seed": 2,
        "max_tokens": 200,
        "stream": True,
    }
    url = f"{cluster.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    deltas = [json.loads(d)["choices"][0]["delta"] for d in data[:-1]]
    calls = [delta["tool_calls"] for delta in deltas if "tool_calls" in delta]
    first, *rest = (call for (call,) in calls)
    assert set(first) == {"index", "id", "type", "function"}
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert rest and all(call.keys() == {"index", "function"} for call in rest)
    assert all(call["function"].keys() == {"arguments"} for call in rest)
    assert json.loads(data[-2])["choices"][0]["finish_reason"] == "tool_calls"
