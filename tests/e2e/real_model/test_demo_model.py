"""The demo's real model (Qwen2.5-Coder-0.5B-Instruct) through the whole stack: real API and
worker processes, the official `openai` client and the second article's `/chat`, greedy
decoding and short replies. It answers a simple question, keeps a chat's context, calls a
tool (read by the `json` parser its worker chose, which the API learns from the worker) and
answers from the tool's result, writes JSON to a schema, and stops a ReAct turn at its stop
word."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict

from tests.support.cluster import Cluster
from tokenrelay.shared.settings import DEMO_MODEL_NAME

# The first test converts the model (`demo_cache_dir`): minutes on a busy machine.
pytestmark = pytest.mark.timeout(1200)

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
WEATHER_QUESTION = {"role": "user", "content": "What's the weather like in Paris right now?"}
WEATHER = {"city": "Paris", "temperature_c": 18, "conditions": "sunny"}
REACT_PROMPT = """Answer the following question as best you can. You have access to the
following tool:

weather: the current weather in a city. Its input is the city's name.

Use this format:

Question: the input question you must answer
Thought: you should always think about what to do
Action: the action to take, which is weather
Action Input: the input to the action
Observation: the result of the action
Thought: I now know the final answer
Final Answer: the final answer to the original question

Begin!

Question: What is the weather in Paris?"""


class Capital(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str
    country: str


@pytest.fixture
def client(demo_cluster: Cluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{demo_cluster.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as c:
        yield c


def chat(client: openai.OpenAI, messages: list[Any], **fields: Any) -> Any:
    return client.chat.completions.create(
        model=DEMO_MODEL_NAME, messages=messages, max_tokens=fields.pop("max_tokens", 48), **fields
    ).choices[0]


def test_the_models_list_shows_the_json_parser_the_demo_worker_chose(
    demo_cluster: Cluster,
) -> None:
    models = httpx.get(f"{demo_cluster.base_url}/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["tool_call_parser"]) for m in models] == [(DEMO_MODEL_NAME, "json")]


def test_the_capital_of_france_is_paris(client: openai.OpenAI) -> None:
    choice = chat(client, [{"role": "user", "content": "What is the capital of France?"}])
    assert choice.finish_reason == "stop"
    assert "Paris" in choice.message.content


def test_a_multi_turn_chat_keeps_its_context(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "My name is Ada. Please remember it."}]
    messages.append({"role": "assistant", "content": chat(client, messages).message.content})
    messages.append({"role": "user", "content": "What is my name?"})
    assert "Ada" in chat(client, messages).message.content


def test_an_auto_tool_call_comes_back_as_tool_calls_and_its_result_becomes_an_answer(
    client: openai.OpenAI,
) -> None:
    choice = chat(client, [WEATHER_QUESTION], tools=[WEATHER_TOOL])
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    answer = chat(
        client,
        [
            WEATHER_QUESTION,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(WEATHER)},
            {"role": "user", "content": "Using that result, answer in one sentence."},
        ],
        tools=[WEATHER_TOOL],
    )
    assert answer.finish_reason == "stop"
    assert "18" in answer.message.content
    assert "sunny" in answer.message.content


def test_a_streamed_auto_tool_call_arrives_as_tool_call_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=DEMO_MODEL_NAME,
        messages=[WEATHER_QUESTION],
        tools=[WEATHER_TOOL],
        max_tokens=48,
        stream=True,
    )
    name, arguments, finish_reason, content = "", "", None, ""
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                name += (delta.function and delta.function.name) or ""
                arguments += (delta.function and delta.function.arguments) or ""
            finish_reason = choice.finish_reason or finish_reason
    assert (name, json.loads(arguments), finish_reason) == (
        "get_weather",
        {"city": "Paris"},
        "tool_calls",
    )
    assert content == ""


def test_a_json_schema_reply_validates(client: openai.OpenAI) -> None:
    choice = chat(
        client,
        [{"role": "user", "content": "Which city is the capital of France? Answer in JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": Capital.model_json_schema()},
        },
        max_tokens=64,
    )
    assert choice.finish_reason == "stop"
    assert Capital.model_validate_json(choice.message.content).city == "Paris"


def test_the_second_articles_react_turn_stops_at_its_stop_word(demo_cluster: Cluster) -> None:
    reply = httpx.post(
        f"{demo_cluster.base_url}/chat",
        json={"query": REACT_PROMPT, "user_stop_words": ["Observation:"], "max_tokens": 96},
        timeout=300,
    )
    assert reply.status_code == 200, reply.text
    text = reply.json()["text"]
    assert text.endswith("Observation:")
    assert "Action: weather" in text
    assert "Paris" in text.split("Action Input:", 1)[1]
