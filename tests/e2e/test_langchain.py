"""langchain-openai against real tokenrelay processes and the random-weight tiny model: a
`bind_tools` agent loop (a forced first call, the tool's result goes back, the model
answers) and `with_structured_output` (a pydantic object every time)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory


class Weather(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]


@tool(args_schema=Weather)
def get_weather(city: str, unit: str) -> str:
    """The weather in a city."""
    return f"sunny and 21 degrees {unit} in {city}"


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confident: bool
    score: int = Field(ge=0, le=10)
    reason: str = Field(max_length=12)


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster({"TOKENRELAY_MAX_INFLIGHT": "4"})


def chat_model(cluster: Cluster, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL_NAME,
        base_url=f"{cluster.base_url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        max_retries=0,
        timeout=60,
        **options,
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_a_bind_tools_agent_loop_runs_end_to_end(cluster: Cluster, streaming: bool) -> None:
    llm = chat_model(
        cluster, temperature=1.2, seed=4, max_tokens=120, streaming=streaming, stream_usage=True
    )
    messages: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]
    first = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    assert isinstance(first, AIMessage)
    (call,) = first.tool_calls
    assert call["name"] == "get_weather"
    Weather.model_validate(call["args"])
    messages += [first, get_weather.invoke(call)]
    assert isinstance(messages[-1], ToolMessage) and messages[-1].tool_call_id == call["id"]
    answer = llm.bind_tools([get_weather]).invoke(messages)
    assert isinstance(answer, AIMessage)
    assert isinstance(answer.content, str) and answer.content
    assert answer.usage_metadata is not None and first.usage_metadata is not None
    # the call and its result went back into the prompt
    assert answer.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"] + 20


def test_with_structured_output_gets_a_valid_object_from_random_weights(
    cluster: Cluster,
) -> None:
    for seed in range(3):
        llm = chat_model(cluster, temperature=1.2, seed=seed, max_tokens=200)
        verdict = llm.with_structured_output(Verdict).invoke("Is the sea blue?")
        assert isinstance(verdict, Verdict)


def test_with_structured_output_by_function_calling_forces_the_call(cluster: Cluster) -> None:
    llm = chat_model(cluster, temperature=1.2, seed=9, max_tokens=200)
    structured = llm.with_structured_output(Verdict, method="function_calling")
    assert isinstance(structured.invoke("Is the sea blue?"), Verdict)
