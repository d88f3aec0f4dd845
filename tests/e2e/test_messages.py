"""Anthropic's Messages API as its official client calls it, unchanged, through real processes
(`tokenrelay api`, `tokenrelay worker`, the tiny model): `messages.create`,
`messages.stream(...)`, `count_tokens` against the reply's usage, a forced `tool_use` answered
by a `tool_result`, stop sequences, and the errors the SDK raises (bad request, unknown model,
authentication, a full cluster's 529); a client that leaves its stream cancels its job."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any, Literal

import anthropic
import httpx
import pytest
import redis
from pydantic import BaseModel, Field

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.harness import Child
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

KEY = "key-a"
GREEDY = {"temperature": 0}
QUESTION: list[Any] = [{"role": "user", "content": "tell me about the sea"}]


class Weather(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": Weather.model_json_schema(),
}


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster(
        {"TOKENRELAY_MAX_INFLIGHT": "8", "TOKENRELAY_FLUSH_INTERVAL_MS": "0"}
    )


@pytest.fixture
def client(cluster: Cluster) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0) as c:
        yield c


def usage_tokens(message: anthropic.types.Message) -> int:
    """The prompt's tokens in Anthropic's reading: prefilled plus read from the cache."""
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def text_of(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_create_answers_a_message_whose_prompt_count_tokens_predicted(
    client: anthropic.Anthropic,
) -> None:
    for fields in ({}, {"system": "Be brief."}, {"system": "Be brief.", "tools": [WEATHER]}):
        message = client.messages.create(
            model=MODEL_NAME, max_tokens=16, messages=QUESTION, extra_body=GREEDY, **fields
        )
        assert message.id.startswith("msg_")
        assert (message.type, message.role, message.model) == ("message", "assistant", MODEL_NAME)
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert 1 <= message.usage.output_tokens <= 16
        count = client.messages.count_tokens(model=MODEL_NAME, messages=QUESTION, **fields)
        assert count.input_tokens == usage_tokens(message), fields


def test_a_stream_gives_the_text_and_final_message_of_the_whole_reply(
    client: anthropic.Anthropic,
) -> None:
    request: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": 24,
        "messages": QUESTION,
        "extra_body": GREEDY,
    }
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == text_of(final) == text_of(whole)
    assert text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert usage_tokens(final) == usage_tokens(whole)


def test_a_forced_tool_use_answered_by_its_result_gets_a_reply(
    client: anthropic.Anthropic,
) -> None:
    forced = client.messages.create(
        model=MODEL_NAME,
        max_tokens=200,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 1.0},
    )
    assert forced.stop_reason == "tool_use"
    [use] = [block for block in forced.content if block.type == "tool_use"]
    assert use.name == "get_weather"
    Weather.model_validate(use.input)
    history: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": forced.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}],
        },
    ]
    reply = client.messages.create(
        model=MODEL_NAME, max_tokens=16, messages=history, tools=[WEATHER], extra_body=GREEDY
    )
    assert reply.type == "message"
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = client.messages.count_tokens(model=MODEL_NAME, messages=history, tools=[WEATHER])
    assert counted.input_tokens == usage_tokens(reply)


def test_a_streamed_forced_call_arrives_as_input_json_deltas(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL_NAME,
        max_tokens=200,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        extra_body={"temperature": 1.0},
    ) as stream:
        fragments = [event.partial_json for event in stream if event.type == "input_json"]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    [use] = [block for block in final.content if block.type == "tool_use"]
    assert Weather.model_validate(use.input)
    assert len(fragments) > 1  # token by token, not one piece at the end


def test_a_stop_sequence_ends_the_reply_and_is_named(client: anthropic.Anthropic) -> None:
    request: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": 40,
        "messages": QUESTION,
        "extra_body": GREEDY,
    }
    text = text_of(client.messages.create(**request))
    assert len(text) >= 8, f"the greedy reply is too short to cut: {text!r}"
    stop = text[5:8]
    before = text[: text.find(stop)]
    stopped = client.messages.create(**request, stop_sequences=["never in it", stop])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert text_of(stopped) == before
    with client.messages.stream(**request, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert text_of(final) == before


def test_bad_requests_raise_the_sdks_errors_in_anthropics_shape(
    client: anthropic.Anthropic,
) -> None:
    with (  # Claude Code's default `max_tokens`, which the SDK sends only streaming
        pytest.raises(anthropic.BadRequestError) as too_long,
        client.messages.stream(model=MODEL_NAME, max_tokens=32_000, messages=QUESTION),
    ):
        pass
    assert too_long.value.status_code == 400
    assert too_long.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in too_long.value.message
    image = {"type": "image", "source": {"type": "url", "url": "http://x/cat.png"}}
    with pytest.raises(anthropic.BadRequestError, match="read text only"):
        client.messages.create(
            model=MODEL_NAME, max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=8, messages=QUESTION)
    body = unknown.value.body
    assert isinstance(body, dict)
    assert (body["type"], set(body["error"])) == ("error", {"type", "message"})
    assert body["error"]["type"] == "not_found_error"


@pytest.fixture(scope="module")
def guarded(make_module_cluster: ClusterFactory) -> Cluster:
    """Keys on, room for one job, pings every half second."""
    return make_module_cluster(
        {
            "TOKENRELAY_API_KEYS": KEY,
            "TOKENRELAY_MAX_INFLIGHT": "1",
            "TOKENRELAY_SSE_PING_S": "0.5",
        }
    )


def only_worker(cluster: Cluster) -> Child:
    [worker] = [child for child in cluster.group.children if child.name == "worker"]
    return worker


def test_the_key_is_taken_as_x_api_key_or_bearer_and_a_wrong_one_is_refused(
    guarded: Cluster,
) -> None:
    for credentials in ({"api_key": "wrong"}, {"auth_token": "wrong"}):
        with anthropic.Anthropic(base_url=guarded.base_url, max_retries=0, **credentials) as c:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                c.messages.create(model=MODEL_NAME, max_tokens=4, messages=QUESTION)
            assert refused.value.body["error"]["type"] == "authentication_error"
    for credentials in ({"api_key": KEY}, {"auth_token": KEY}):
        with anthropic.Anthropic(base_url=guarded.base_url, max_retries=0, **credentials) as c:
            assert c.messages.create(model=MODEL_NAME, max_tokens=4, messages=QUESTION).content


def test_a_full_cluster_is_the_sdks_overloaded_error(guarded: Cluster) -> None:
    """The worker paused, a queued job holds the only slot: the next message is a 529."""
    worker = only_worker(guarded)
    bearer = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=guarded.base_url, headers=bearer, timeout=30) as http:
        worker.signal(signal.SIGSTOP)
        try:
            held = http.post("/v1/jobs", json={"model": MODEL_NAME, "messages": QUESTION})
            assert held.status_code == 202
            with (
                anthropic.Anthropic(base_url=guarded.base_url, api_key=KEY, max_retries=0) as c,
                pytest.raises(anthropic.OverloadedError) as full,
            ):
                c.messages.create(model=MODEL_NAME, max_tokens=4, messages=QUESTION)
            assert full.value.status_code == 529
            assert full.value.body["error"]["type"] == "overloaded_error"
            assert int(full.value.response.headers["retry-after"]) >= 1
            http.delete(f"/v1/jobs/{held.json()['id']}")
        finally:
            worker.signal(signal.SIGCONT)


def test_a_client_that_leaves_its_stream_cancels_its_message(guarded: Cluster) -> None:
    """The worker paused, the stream starts with a ping; the client reads it and leaves."""
    worker = only_worker(guarded)
    body = {"model": MODEL_NAME, "max_tokens": 64, "messages": QUESTION, "stream": True}
    store = redis.Redis.from_url(guarded.redis_url, decode_responses=True)
    with httpx.Client(base_url=guarded.base_url, headers={"x-api-key": KEY}, timeout=30) as http:
        worker.signal(signal.SIGSTOP)
        try:
            with http.stream("POST", "/v1/messages", json=body) as response:
                assert response.status_code == 200
                assert next(response.iter_lines()) == "event: ping"
                job_id = store.lrange(keys.recent_jobs(), 0, 0)[0]
            eventually(
                lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled",
                10,
                "the left stream's job to be cancelled",
            )
        finally:
            worker.signal(signal.SIGCONT)
            store.close()
