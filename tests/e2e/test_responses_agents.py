"""The OpenAI Agents SDK, unchanged, runs an agent with one function tool against real
tokenrelay processes (the tiny model) over `/v1/responses`: the forced call (the only call
random weights can be relied on for) runs the tool, and the next turn, which sends the call
and its output back as input items, answers in the agent's output type (a JSON schema, so
the reply ends where its grammar does rather than at `max_tokens`, which the SDK takes for
a failure)."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory


class Forecast(BaseModel):
    sky: Literal["sunny", "rainy"]


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster({"TOKENRELAY_MAX_INFLIGHT": "4"})


def test_an_agent_calls_its_function_tool_and_answers(cluster: Cluster) -> None:
    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    async def run() -> object:
        client = AsyncOpenAI(base_url=f"{cluster.base_url}/v1", api_key="unused", max_retries=0)
        try:
            agent = Agent(
                name="weather",
                instructions="Use the tool.",
                model=OpenAIResponsesModel(MODEL_NAME, client),
                tools=[get_weather],
                output_type=Forecast,
                model_settings=ModelSettings(
                    tool_choice="get_weather", max_tokens=100, temperature=0
                ),
            )
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        finally:
            await client.close()

    result = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert len(calls) == 1
    items = result.new_items  # type: ignore[attr-defined]
    [call] = [item for item in items if isinstance(item, ToolCallItem)]
    [output] = [item for item in items if isinstance(item, ToolCallOutputItem)]
    assert json.loads(call.raw_item.arguments) == {"city": calls[0]}  # type: ignore[union-attr]
    assert output.output == f"sunny in {calls[0]}"
    responses = result.raw_responses  # type: ignore[attr-defined]
    assert len(responses) == 2  # the call, then (tool choice reset to auto) an answer
    assert responses[1].usage.input_tokens > responses[0].usage.input_tokens
    assert isinstance(result.final_output, Forecast)  # type: ignore[attr-defined]
