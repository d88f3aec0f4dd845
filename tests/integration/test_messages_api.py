"""`/v1/messages` in-process against a real Redis: Anthropic's error shape on every path under
it (validation, unknown fields and routes, auth, Redis outages, a full cluster), the
no-effect header on a stream's 200, and `count_tokens` agreeing with the worker's count.

Where a worker's part matters, a fake worker plays it through the scripts a worker runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from rq import Queue

from tokenrelay.api.anthropic.schema import MessagesRequest
from tokenrelay.api.app import create_app
from tokenrelay.shared.events import Done, Error, Started, TokenChunk, Usage
from tokenrelay.shared.jobs import JobStatus
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts
from tokenrelay.shared.redis.model_limits import LimitsPublisher
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings

MODEL = "m"
LIMIT_BYTES = 64 * 1024
TOO_LONG = "this model's maximum context length is 2048 tokens"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]} | (
        fields
    )


@pytest.fixture
def app_settings(redis_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        served_model_name=MODEL,
        max_request_bytes=LIMIT_BYTES,
        max_tokens_limit=1000,
        lease_ttl_s=1,
        max_queue_wait_s=30,
    )


@pytest.fixture
def client(app_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(app_settings)) as test_client:
        yield test_client


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    """Anthropic's error shape, exactly; returns the message."""
    assert response.status_code == status, response.text
    payload = response.json()
    assert set(payload) == {"type", "error"}
    assert payload["type"] == "error"
    assert set(payload["error"]) == {"type", "message"}
    assert payload["error"]["type"] == kind
    return str(payload["error"]["message"])


@pytest.mark.parametrize(
    ("method", "path", "payload", "status", "kind", "mentions"),
    [
        ("POST", "/v1/messages", b"{not json", 400, "invalid_request_error", "not valid JSON"),
        (
            "POST",
            "/v1/messages",
            {"model": MODEL, "messages": body()["messages"]},
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        ("POST", "/v1/messages", body(colour="blue"), 400, "invalid_request_error", "Anthropic's"),
        ("POST", "/v1/messages", body(max_tokens=32000), 400, "invalid_request_error", "<= 1000"),
        ("POST", "/v1/messages", body(model="claude-opus"), 404, "not_found_error", "not served"),
        (
            "POST",
            "/v1/messages",
            body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            400,
            "invalid_request_error",
            "read text only",
        ),
        ("POST", "/v1/messages/count_tokens", body(), 400, "invalid_request_error", "max_tokens"),
        ("POST", "/v1/messages/nope", body(), 404, "not_found_error", "no such route"),
        ("GET", "/v1/messages", None, 405, "invalid_request_error", "Method Not Allowed"),
        ("POST", "/v1/messages", b"x" * (LIMIT_BYTES + 1), 413, "request_too_large", "limit"),
        (
            "POST",
            "/v1/messages/count_tokens",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            529,
            "overloaded_error",
            "published its tokenizer",
        ),
    ],
)
def test_every_error_under_v1_messages_is_in_anthropics_shape(
    client: TestClient,
    method: str,
    path: str,
    payload: Any,
    status: int,
    kind: str,
    mentions: str,
) -> None:
    if isinstance(payload, bytes):
        headers = {"content-type": "application/json"}
        response = client.request(method, path, content=payload, headers=headers)
    else:
        response = client.request(method, path, json=payload)
    assert mentions in assert_anthropic_error(response, status, kind)
    if status == 529:
        assert response.headers["Retry-After"] == "1"


def test_the_openai_paths_keep_the_openai_shape(client: TestClient) -> None:
    for path in ("/v1/messagesX", "/v1/chat/completions/x"):
        error = client.post(path, json=body()).json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
    chat = {"model": MODEL, "messages": body()["messages"], "colour": 1}
    unknown = client.post("/v1/chat/completions", json=chat).json()
    assert "OpenAI's API" in unknown["error"]["message"]


def test_a_key_is_taken_as_x_api_key_or_bearer(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, served_model_name=MODEL, api_keys=["key-a"])
    with TestClient(create_app(settings)) as keyed:
        for headers in ({}, {"x-api-key": "nope"}, {"Authorization": "Bearer nope"}):
            response = keyed.post("/v1/messages", json=body(), headers=headers)
            assert "API key" in assert_anthropic_error(response, 401, "authentication_error")
        for headers in ({"x-api-key": "key-a"}, {"Authorization": "Bearer key-a"}):
            past_the_key = keyed.post("/v1/messages", json=body(model="x"), headers=headers)
            assert_anthropic_error(past_the_key, 404, "not_found_error")
        models = keyed.get("/v1/models", headers={"x-api-key": "key-a"})
        assert models.status_code == 200


def test_redis_unreachable_is_a_529_overloaded_error_with_retry_after() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", served_model_name=MODEL)
    with TestClient(create_app(settings)) as unreachable:
        for path, payload in (("/v1/messages", body()), ("/v1/messages/count_tokens", body())):
            payload.pop("max_tokens") if path.endswith("count_tokens") else None
            response = unreachable.post(path, json=payload)
            assert "Redis" in assert_anthropic_error(response, 529, "overloaded_error")
            assert response.headers["Retry-After"] == "1"


def test_a_full_cluster_is_a_529_overloaded_error(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, served_model_name=MODEL, max_inflight=1)
    with TestClient(create_app(settings)) as full:
        held = full.post("/v1/jobs", json={"model": MODEL, "messages": body()["messages"]})
        assert held.status_code == 202
        response = full.post("/v1/messages", json=body(stream=True))
        assert_anthropic_error(response, 529, "overloaded_error")
        assert int(response.headers["Retry-After"]) >= 1


def serve_one_job(settings: Settings, texts: list[str], done: Done | Error) -> None:
    """Play a worker for the next queued job: start it, stream `texts`, end it with `done`."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        queue = Queue.redis_queue_namespace_prefix + keys.generation_queue(MODEL, "normal")
        popped = client.blpop([queue], 10)
        assert popped is not None, "no job was enqueued"
        job_id = popped[1]
        run = SyncScripts(client).run
        started = Started(worker="fake", prompt_tokens=7)
        assert run(job_scripts.start(settings, job_id, "fake", started.to_wire())) == "running"
        chunks = [
            (job_id, i + 1, TokenChunk(text=t, tokens=1).to_wire()) for i, t in enumerate(texts)
        ]
        if chunks:
            run(plane_scripts.emit(settings, chunks))
        status = JobStatus.SUCCEEDED if isinstance(done, Done) else JobStatus.FAILED
        run(job_scripts.finish(settings, job_id, status, {}, done.to_wire(), len(texts) + 1))
    finally:
        client.close()


USAGE = Usage(prompt_tokens=7, completion_tokens=2, total_tokens=9)
CLAUDE_CODE_DEFAULTS: dict[str, Any] = {
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Reply with the word hello"}]},
        {"role": "system", "content": "A reminder."},
    ],
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": []},
    "output_config": {"effort": "high"},
    "metadata": {"user_id": "user_1"},
}
NO_EFFECT = (
    "thinking,context_management,metadata,output_config.effort,system.*.cache_control,beta,"
    "anthropic-beta"
)


@pytest.mark.parametrize("stream", [True, False])
def test_claude_codes_request_runs_and_its_no_effect_fields_are_named_on_the_200(
    client: TestClient, app_settings: Settings, stream: bool
) -> None:
    done = Done(finish_reason="stop", usage=USAGE, stop_sequence="END")
    with ThreadPoolExecutor(1) as pool:
        worker = pool.submit(serve_one_job, app_settings, ["hel", "lo"], done)
        response = client.post(
            "/v1/messages?beta=true",
            json=body(stream=stream, stop_sequences=["END"], **CLAUDE_CODE_DEFAULTS),
            headers={
                "anthropic-version": "2023-06-01",
                "anthropic-beta": "claude-code-20250219,context-management-2025-06-27",
            },
        )
        worker.result(timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["x-tokenrelay-no-effect"] == NO_EFFECT
    if not stream:
        message = response.json()
        assert message["content"] == [{"type": "text", "text": "hello"}]
        assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
        assert message["usage"]["input_tokens"] + message["usage"]["cache_read_input_tokens"] == 7
        return
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = [frame.split("\n") for frame in response.text.split("\n\n") if frame]
    names = [lines[0].removeprefix("event: ") for lines in frames]
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    data = [json.loads(lines[1].removeprefix("data: ")) for lines in frames]
    assert data[0]["message"]["usage"]["input_tokens"] == 7
    text = "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta")
    assert text == "hello"
    assert data[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


@pytest.mark.parametrize("stream", [True, False])
def test_a_prompt_over_the_context_window_is_anthropics_400_streaming_or_not(
    client: TestClient, app_settings: Settings, stream: bool
) -> None:
    error = Error(error_type="context_length_exceeded", message=TOO_LONG)
    with ThreadPoolExecutor(1) as pool:
        worker = pool.submit(serve_one_job, app_settings, [], error)
        response = client.post("/v1/messages", json=body(stream=stream))
        worker.result(timeout=10)
    assert TOO_LONG in assert_anthropic_error(response, 400, "invalid_request_error")


def test_count_tokens_counts_what_the_worker_will(
    client: TestClient, app_settings: Settings, sync_redis: redis.Redis, tiny_model_dir: Path
) -> None:
    """The API renders the chat template its workers publish and tokenizes with their
    tokenizer: the same ids as the worker's own `encode_chat`, tools and history included."""
    from tokenrelay.worker.engines.model_files import ModelFiles

    files = ModelFiles(str(tiny_model_dir))
    publisher = LimitsPublisher(MODEL, 2048, 32_768, files.tokenizer_json(), files.chat_template())
    publisher.publish(sync_redis)
    weather = {
        "name": "get_weather",
        "description": "The weather in a city — «quoted».",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    requests: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"system": "Be brief.", "messages": [{"role": "user", "content": "héllo <|im_end|>"}]},
        {key: value for key, value in CLAUDE_CODE_DEFAULTS.items() if key != "metadata"},
        {"tools": [weather], "messages": [{"role": "user", "content": "weather?"}]},
        {
            "tools": [weather],
            "tool_choice": {"type": "none"},
            "messages": [{"role": "user", "content": "x"}],
        },
        {
            "tools": [weather],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
                },
            ],
        },
    ]
    counts = []
    for fields in requests:
        request = {"model": MODEL, **fields}
        response = client.post("/v1/messages/count_tokens", json=request)
        assert response.status_code == 200, response.text
        generation = MessagesRequest.model_validate(request | {"max_tokens": 1}).to_chat()
        expected = files.encode_chat(*_prompt(generation.to_generation(app_settings)))
        assert response.json() == {"input_tokens": len(expected)}
        counts.append(len(expected))
    assert len(set(counts)) == len(counts)  # each request's prompt differs


def _prompt(generation: Any) -> tuple[Any, Any]:
    return generation.messages, generation.tools


def test_a_refused_message_counts_under_tokenrelays_error_type(client: TestClient) -> None:
    """Anthropic's body has no place for the stable `error_type`; the metrics keep it."""
    assert client.post("/v1/messages", json=body(model="x")).status_code == 404
    assert client.post("/v1/messages", json=body(colour=1)).status_code == 400
    scrape = client.get("/metrics").text
    assert 'tokenrelay_rejections_total{reason="model_not_found"} 1.0' in scrape
    assert 'tokenrelay_rejections_total{reason="invalid_request_error"} 1.0' in scrape
