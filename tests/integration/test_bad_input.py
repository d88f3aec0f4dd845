"""Bad input never hurts: every malformed request gets a 4xx in the OpenAI error shape whose
message names the field, and schemathesis finds no 5xx anywhere in the OpenAPI schema.

In-process against a real Redis. Where a worker's verdict matters (a prompt over the context
window, a queue wait running out), a fake worker plays the worker's side of the Redis
protocol: it takes the job from RQ's queue and runs the same scripts a worker runs.
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
import requests
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rq import Queue
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import get_client, shutdown_lifespans
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tokenrelay.api.api_keys import hash_key
from tokenrelay.api.app import create_app
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.events import Done, Error, Started, TokenChunk, Usage
from tokenrelay.shared.jobs import JobStatus
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts
from tokenrelay.shared.redis.model_limits import ChatTemplate, LimitsPublisher
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings

MODEL = "m"
MESSAGES = [{"role": "user", "content": "hi"}]
LIMIT_BYTES = 64 * 1024
TOO_LONG = "maximum context length is 2048 tokens; asked for 5100 (5000 in the messages)"


def make_settings(redis_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        served_model_name=MODEL,
        max_request_bytes=LIMIT_BYTES,
        max_tokens_limit=1000,
        default_max_tokens=100,
        lease_ttl_s=1,
        max_queue_wait_s=30,
    )


@pytest.fixture(scope="module")
def api(redis_server: EmbeddedRedis) -> Iterator[TestClient]:
    """One app for the tests whose requests never reach a worker."""
    with TestClient(create_app(make_settings(redis_server.url))) as test_client:
        yield test_client


@pytest.fixture
def app_settings(redis_url: str) -> Settings:
    return make_settings(redis_url)


@pytest.fixture
def client(app_settings: Settings) -> Iterator[TestClient]:
    """A fresh Redis and app, for the tests that play the worker's part."""
    with TestClient(create_app(app_settings)) as test_client:
        yield test_client


def assert_error(response: httpx.Response, status: int, code: str, param: str | None) -> str:
    """The OpenAI error shape, with `param` named in the message; returns the message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    if param is not None:
        assert param in error["message"]
    return str(error["message"])


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, **fields}


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"model": MODEL}, "messages"),
    (body(messages="hi"), "messages"),
    (body(messages=[]), "messages"),
    (body(messages=["hi"]), "messages.0"),
    (body(model=5), "model"),
    (body(model=""), "model"),
    (body(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
    (body(messages=[{"content": "x"}]), "messages.0.role"),
    (body(messages=[{"role": "user", "content": ""}]), "messages.0.content"),
    (body(messages=[{"role": "system", "content": None}]), "messages.0.content"),
    (body(messages=[{"role": "user", "content": []}]), "messages.0.content"),
    (body(messages=[{"role": "user", "content": 5}]), "messages.0.content"),
    (
        body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages.0.content.0.type",
    ),
    (body(max_tokens=0), "max_tokens"),
    (body(max_tokens=-5), "max_tokens"),
    (body(max_tokens=1001), "max_tokens"),
    (body(max_tokens=10**30), "max_tokens"),
    (body(max_tokens="many"), "max_tokens"),
    (body(max_tokens=1.5), "max_tokens"),
    (body(max_completion_tokens=0), "max_completion_tokens"),
    (body(max_tokens=5, min_tokens=6), "min_tokens"),
    (body(temperature=-0.1), "temperature"),
    (body(temperature=2.5), "temperature"),
    (body(temperature="hot"), "temperature"),
    (body(top_p=0), "top_p"),
    (body(top_p=1.5), "top_p"),
    (body(stop=["a", "b", "c", "d", "e"]), "stop"),
    (body(stop=[""]), "stop"),
    (body(stop=[1]), "stop.0"),
    (body(seed=2**64), "seed"),
    (body(n=2), "n"),
    (body(logprobs="maybe"), "logprobs"),
    (body(logprobs=True, top_logprobs=21), "top_logprobs"),
    (body(stream="maybe"), "stream"),
    (body(stream_options={"include_usage": "often"}), "stream_options.include_usage"),
    (body(metadata={"k": 1}), "metadata.k"),
    (body(top_k_typo=3), "top_k_typo"),
    (body(logit_bias={"x": 1}), "logit_bias.x"),
    (body(logit_bias={"5": 101}), "logit_bias.5"),
    (body(frequency_penalty=3), "frequency_penalty"),
    (body(presence_penalty=-2.5), "presence_penalty"),
    (body(repetition_penalty=0), "repetition_penalty"),
    (body(stop_token_ids=[-1]), "stop_token_ids.0"),
    (body(top_k=-2), "top_k"),
    (body(stream_options={"include_usage": True, "extra": 1}), "stream_options.extra"),
    (body(stream_options={"include_obfuscation": True}), "stream_options.include_obfuscation"),
    (body(messages=[{"role": "user", "content": "hi", "name": "ann"}]), "messages.0.name"),
    (body(messages=[{"role": "user", "content": "hi", "colour": 1}]), "messages.0.colour"),
    (
        body(messages=[{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]),
        "messages.0.content.0.x",
    ),
    (body(store=True), "store"),
    (body(service_tier="flex"), "service_tier"),
    (body(modalities=["text", "audio"]), "modalities.1"),
    (body(response_format={"type": "xml"}), "response_format"),
    (body(response_format={"type": "json_schema"}), "response_format.json_schema.json_schema"),
    (
        body(response_format={"type": "json_schema", "json_schema": {"name": "v", "x": 1}}),
        "response_format.json_schema.json_schema.x",
    ),
    (body(response_format={"type": "json_object"}, min_tokens=2), "min_tokens"),
    (body(top_logprobs=2), "top_logprobs"),
    (body(tools=[]), "tools"),
    (body(tool_choice="auto"), "tool_choice"),
    (body(audio={"voice": "alloy"}), "audio"),
    (body(reasoning_effort="low"), "reasoning_effort"),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/jobs"])
@pytest.mark.parametrize(("payload", "param"), BAD_BODIES)
def test_bad_field_is_a_400_naming_it(
    api: TestClient, path: str, payload: dict[str, Any], param: str
) -> None:
    assert_error(api.post(path, json=payload), 400, "invalid_request_error", param)


COMPLETION_BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"model": MODEL, "prompt": "hi", "echo": True}, "echo"),
    ({"model": MODEL, "prompt": "hi", "suffix": "end"}, "suffix"),
    ({"model": MODEL, "prompt": "hi", "best_of": 2}, "best_of"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"model": MODEL, "prompt": "hi", "messages": MESSAGES}, "messages"),
    ({"model": MODEL, "prompt": "hi", "metadata": {}}, "metadata"),
]


@pytest.mark.parametrize(("payload", "param"), COMPLETION_BAD_BODIES)
def test_bad_completion_field_is_a_400_naming_it(
    api: TestClient, payload: dict[str, Any], param: str
) -> None:
    assert_error(api.post("/v1/completions", json=payload), 400, "invalid_request_error", param)


def responses_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hi", **fields}


IMAGE = {"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}
RESPONSES_BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"input": "hi"}, "model"),
    (responses_body(input=5), "input"),
    (responses_body(input=[{"role": "robot", "content": "x"}]), "input.0.role"),
    (responses_body(input=[{"role": "user", "content": "x", "colour": 1}]), "input.0.colour"),
    (responses_body(input=[{"type": "reasoning", "summary": []}]), "input.0.type"),
    (responses_body(input=[IMAGE]), "input.0.content.0.type"),
    (
        responses_body(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
        "input.0.call_id",
    ),
    (responses_body(max_output_tokens=0), "max_output_tokens"),
    (responses_body(max_output_tokens=1001), "max_output_tokens"),
    (responses_body(temperature=2.5), "temperature"),
    (responses_body(top_logprobs=21), "top_logprobs"),
    (responses_body(tools=[{"type": "web_search"}]), "tools.0.type"),
    (responses_body(tools=[{"type": "function", "name": "bad name"}]), "tools.0.name"),
    (responses_body(tool_choice="required"), "tool_choice"),
    (responses_body(text={"format": {"type": "xml"}}), "text.format"),
    (responses_body(truncation="sometimes"), "truncation"),
    (responses_body(metadata={"k": 1}), "metadata.k"),
    (responses_body(conversation="conv_1"), "conversation"),
    (responses_body(prompt={"id": "p"}), "prompt"),
    (responses_body(background=True, store=False), "store"),
    (responses_body(frobnicate=True), "frobnicate"),
]


@pytest.mark.parametrize(("payload", "param"), RESPONSES_BAD_BODIES)
def test_bad_responses_field_is_a_400_naming_it(
    api: TestClient, payload: dict[str, Any], param: str
) -> None:
    assert_error(api.post("/v1/responses", json=payload), 400, "invalid_request_error", param)


def test_unknown_response_ids_are_404_on_every_response_route(api: TestClient) -> None:
    for response_id in ("resp_" + "0" * 32, "0" * 32, "resp_bad%20id", "resp_" + "x" * 200):
        for method, suffix in (
            ("GET", ""),
            ("GET", "?stream=true&starting_after=3"),
            ("POST", "/cancel"),
            ("DELETE", ""),
            ("GET", "/input_items"),
        ):
            response = api.request(method, f"/v1/responses/{response_id}{suffix}")
            assert_error(response, 404, "response_not_found", "response_id")


def test_an_unknown_field_is_refused_not_ignored(api: TestClient) -> None:
    message = assert_error(
        api.post("/v1/chat/completions", json=body(frobnicate=True)),
        400,
        "invalid_request_error",
        "frobnicate",
    )
    assert "refused rather than ignored" in message


def test_null_for_a_refused_field_counts_as_absent(api: TestClient) -> None:
    """Clients that send every field send `null` for the ones they leave unset."""
    response = api.post("/v1/chat/completions", json=body(tools=None, audio=None, max_tokens=0))
    assert_error(response, 400, "invalid_request_error", "max_tokens")


def test_unknown_model_is_a_404_naming_the_served_one(api: TestClient) -> None:
    response = api.post("/v1/chat/completions", json=body(model="gpt-4"))
    assert MODEL in assert_error(response, 404, "model_not_found", "model")


@pytest.mark.parametrize(
    ("raw", "mentions"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"model": "m", "messages": [', "not valid JSON"),
        (b"", "request body"),
        (b"[1, 2]", "request body"),
        (b'"just a string"', "request body"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "UTF-8"),
        (b"\xc3\x28", "request body"),
    ],
)
def test_malformed_body_is_a_400_naming_the_body(
    api: TestClient, raw: bytes, mentions: str
) -> None:
    response = api.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert mentions in assert_error(response, 400, "invalid_request_error", None)


POST_ROUTES = [
    "/",
    "/chat",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/jobs",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
]


def assert_client_error(response: httpx.Response, path: str) -> str:
    """A 4xx in the OpenAI error shape, in Anthropic's under `/v1/messages`, or in the first
    article's own on `POST /` (where the route answers; a refusal before it, such as a 413 or
    401, keeps the OpenAI shape)."""
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    if path == "/" and "status" in body:
        assert body["status"] == response.status_code
        return str(body["response"])
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
        return str(body["error"]["message"])
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["message"])


@pytest.mark.parametrize("path", POST_ROUTES)
@pytest.mark.parametrize("depth", [1000, None])
@pytest.mark.parametrize(("opening", "closing"), [(b"[", b"]"), (b'{"a":', b"}")])
def test_deeply_nested_json_is_a_400_on_every_route(
    api: TestClient, path: str, depth: int | None, opening: bytes, closing: bytes
) -> None:
    """1,000 deep, and as deep as the body limit allows (None)."""
    depth = depth or (LIMIT_BYTES - 100) // len(opening + closing)
    raw = opening * depth + b"1" * (opening != b"[") + closing * depth
    for field in (b"", b'"messages": ', b'"history": '):  # at the top, and inside a field
        nested = raw if not field else b'{"prompt": "x", "query": "x", ' + field + raw + b"}"
        response = api.post(path, content=nested, headers={"content-type": "application/json"})
        assert_client_error(response, path)


HUGE_NUMBERS = [b"9" * 5000, b"9" * 4000, b"1e999", b"-1e999", b"NaN", b"Infinity", b"1e308"]


@pytest.mark.parametrize(
    ("path", "field"),
    [(path, field) for path in POST_ROUTES for field in (b"max_tokens", b"temperature")]
    + [(path, field) for path in POST_ROUTES[2:] for field in (b"top_p", b"seed")],
)  # the article routes take neither `top_p` nor `seed`: what they ignore cannot hurt
def test_huge_numbers_are_a_400_on_every_route(api: TestClient, path: str, field: bytes) -> None:
    for number in HUGE_NUMBERS:
        raw = b'{"model": "m", "prompt": "x", "query": "x", "' + field + b'": ' + number
        raw += b', "messages": [{"role": "user", "content": "x"}]}'
        response = api.post(path, content=raw, headers={"content-type": "application/json"})
        assert_client_error(response, path)


def test_lone_surrogate_in_content_is_a_400(api: TestClient) -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    response = api.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert "surrogate" in assert_error(response, 400, "invalid_request_error", "messages.0.content")


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/completions", b'{"model": "m", "prompt": "a\\ud800b"}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": ["\\udfff"]}', "prompt"),
        (
            "/v1/chat/completions",
            b'{"model": "m", "stop": ["\\ud800"], "messages": [%s]}',
            "stop.0",
        ),
        ("/chat", b'{"query": "q", "user_stop_words": ["x", "\\ud800"]}', "stop.1"),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [%s], "tools": [{"type": "function", "function": '
            b'{"name": "f", "description": "\\ud800"}}]}',
            "tools.0",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", '
            b'"type": "function", "function": {"name": "f", "arguments": "\\udfff"}}]}, %s]}',
            "messages.0.tool_calls.0",
        ),
    ],
)
def test_lone_surrogate_in_a_prompt_or_stop_string_is_a_400(
    api: TestClient, path: str, raw: bytes, param: str
) -> None:
    raw = raw.replace(b"%s", json.dumps(MESSAGES[0]).encode())
    response = api.post(path, content=raw, headers={"content-type": "application/json"})
    assert "surrogate" in assert_error(response, 400, "invalid_request_error", param)


def test_body_over_the_limit_is_a_413_declared_or_streamed(api: TestClient) -> None:
    huge = json.dumps(body(messages=[{"role": "user", "content": "x" * LIMIT_BYTES}])).encode()
    declared = api.post("/v1/jobs", content=huge, headers={"content-type": "application/json"})
    assert "TOKENRELAY_MAX_REQUEST_BYTES" in assert_error(declared, 413, "request_too_large", None)

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked, counted as it arrives
        for start in range(0, len(huge), 4096):
            yield huge[start : start + 4096]

    streamed = api.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in streamed.request.headers
    assert_error(streamed, 413, "request_too_large", None)
    fits = json.dumps(body(messages=[{"role": "user", "content": "x" * (LIMIT_BYTES - 200)}]))
    accepted = api.post("/v1/jobs", content=fits, headers={"content-type": "application/json"})
    assert accepted.status_code == 202, accepted.text


def test_unknown_job_ids_are_404_on_every_job_route(api: TestClient) -> None:
    for job_id in ("0" * 32, "no-such-job", "bad%20id", "x" * 200):
        for method, suffix in (("GET", ""), ("DELETE", ""), ("GET", "/events")):
            response = api.request(method, f"/v1/jobs/{job_id}{suffix}")
            assert_error(response, 404, "job_not_found", None)


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", " 3", "²", "9" * 30, "1" * 5000])
def test_invalid_last_event_id_is_a_400_naming_the_header(api: TestClient, value: str) -> None:
    job_id = api.post("/v1/jobs", json=body()).json()["id"]
    response = api.get(
        f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": value.encode("latin-1")}
    )
    assert_error(response, 400, "invalid_request_error", "Last-Event-ID")


def test_unknown_route_and_wrong_method_are_4xx_in_the_openai_shape(api: TestClient) -> None:
    assert_error(api.get("/v1/nothing"), 404, "not_found", None)
    wrong = api.put("/v1/chat/completions", json=body())
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "invalid_request_error"


def serve_one_job(app_settings: Settings, outcome: str) -> str:
    """Play a worker for the next queued job: start it, then fail it over the context window
    (`outcome="too_long"`, as a real worker does after tokenizing) or stream one token."""
    client = redis.Redis.from_url(app_settings.redis_url, decode_responses=True)
    try:
        queue = Queue.redis_queue_namespace_prefix + keys.generation_queue(MODEL, "normal")
        popped = client.blpop([queue], 10)
        assert popped is not None, "no job was enqueued"
        job_id = popped[1]
        run = SyncScripts(client).run
        started = Started(worker="fake", prompt_tokens=5000)
        assert run(job_scripts.start(app_settings, job_id, "fake", started.to_wire())) == "running"
        if outcome == "too_long":
            error = Error(error_type="context_length_exceeded", message=TOO_LONG)
            fields = {"error_type": error.error_type, "error_message": error.message}
            run(job_scripts.finish(app_settings, job_id, JobStatus.FAILED, fields, error.to_wire()))
        else:
            token = TokenChunk(text="hi", tokens=1)
            run(plane_scripts.emit(app_settings, [(job_id, 1, token.to_wire())]))
            done = Done(
                finish_reason="stop",
                usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
            )
            fields = {"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1}
            run(
                job_scripts.finish(
                    app_settings, job_id, JobStatus.SUCCEEDED, fields, done.to_wire()
                )
            )
        return str(job_id)
    finally:
        client.close()


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_over_the_context_window_is_a_400_streaming_or_not(
    client: TestClient, app_settings: Settings, stream: bool
) -> None:
    with ThreadPoolExecutor(1) as pool:
        worker = pool.submit(serve_one_job, app_settings, "too_long")
        response = client.post("/v1/chat/completions", json=body(stream=stream))
        worker.result(timeout=10)
    assert TOO_LONG in assert_error(response, 400, "context_length_exceeded", "messages")


def test_a_stream_starts_with_its_first_token(client: TestClient, app_settings: Settings) -> None:
    with ThreadPoolExecutor(1) as pool:
        worker = pool.submit(serve_one_job, app_settings, "tokens")
        response = client.post("/v1/chat/completions", json=body(stream=True))
        worker.result(timeout=10)
    assert response.status_code == 200
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "hi"


def test_a_stream_whose_queue_wait_runs_out_is_a_503_expired(redis_url: str) -> None:
    settings_ = Settings(
        redis_url=redis_url, served_model_name=MODEL, lease_ttl_s=1, max_queue_wait_s=0.3
    )
    with TestClient(create_app(settings_)) as quick:
        response = quick.post("/v1/chat/completions", json=body(stream=True))
    assert_error(response, 503, "expired", None)


# The schema is read eagerly (schemathesis' lazy `from_fixture` does not run on this pytest);
# requests go in-process to an app on the test's Redis, with no worker. So that no valid
# request waits for one, every request carries a key whose in-flight quota (1) is already
# taken by a queued job: what passes validation is refused with a 429 at admission.
schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
FUZZ_KEY = "sk-fuzz"
FUZZ_HEADERS = {"Authorization": f"Bearer {FUZZ_KEY}"}


@pytest.fixture
def guarded_app_settings(redis_url: str, tmp_path: Path) -> Settings:
    """Settings whose one key (`FUZZ_KEY`) may hold one job: see `hold_the_quota`."""
    keys_file = tmp_path / "keys.json"
    entry = {"sha256": hash_key(FUZZ_KEY), "max_inflight": 1, "admin": True}
    keys_file.write_text(json.dumps([entry]))
    return Settings(
        redis_url=redis_url,
        api_keys_file=str(keys_file),
        max_request_bytes=LIMIT_BYTES,
        max_queue_wait_s=3600,
    )


def publish_a_tokenizer(redis_url: str) -> None:
    """A word-level tokenizer and a one-line chat template for the served model, as a worker
    publishes them: `POST /v1/messages/count_tokens` counts with them instead of answering
    that no worker published any (a 529, which would read as a server error here)."""
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    template = ChatTemplate(
        templates={"default": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    )
    publisher = LimitsPublisher(Settings().model_id, 2048, 32_768, tokenizer.to_str(), template)
    client = redis.Redis.from_url(redis_url)
    try:
        publisher.publish(client)
    finally:
        client.close()


def hold_the_quota(post: Any) -> None:
    held = post(
        "http://testserver/v1/jobs",
        json={"model": Settings().model_id, "messages": MESSAGES},
        headers=FUZZ_HEADERS,
    )
    assert held.status_code == 202, held.text


@pytest.fixture
def asgi_session(guarded_app_settings: Settings) -> Iterator[requests.Session]:
    publish_a_tokenizer(guarded_app_settings.redis_url)
    with get_client(create_app(guarded_app_settings)) as session:
        hold_the_quota(session.post)
        yield session
    shutdown_lifespans()


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_schemathesis_finds_no_server_error(
    case: schemathesis.Case, asgi_session: requests.Session
) -> None:
    case.call_and_validate(
        session=asgi_session,
        base_url="http://testserver",
        headers=FUZZ_HEADERS,
        checks=[not_a_server_error],
    )


@pytest.fixture
def guarded_api(guarded_app_settings: Settings) -> Iterator[TestClient]:
    publish_a_tokenizer(guarded_app_settings.redis_url)
    with TestClient(create_app(guarded_app_settings), raise_server_exceptions=False) as client:
        hold_the_quota(client.post)
        yield client


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["model", "messages", "prompt", "query", "role", "content", "stop"])
            | st.text(max_size=8),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)
VALID_BODY = json.dumps({"model": Settings().model_id, "messages": MESSAGES, "prompt": "x"})


def mutated(body: str, position: int, insert: bytes, cut: int) -> bytes:
    raw = body.encode()
    position %= len(raw) + 1
    return raw[:position] + insert + raw[position + cut :]


RAW_BODIES = st.one_of(
    st.binary(max_size=512),
    JSON_VALUES.map(lambda value: json.dumps(value, allow_nan=True).encode()),
    st.builds(
        mutated, st.just(VALID_BODY), st.integers(0, 200), st.binary(max_size=8), st.integers(0, 8)
    ),
    st.text(max_size=64).map(lambda text: text.encode("utf-16")),
)


@given(
    path=st.sampled_from(POST_ROUTES),
    raw=RAW_BODIES,
    content_type=st.sampled_from(
        ["application/json", "application/octet-stream", "text/plain; charset=latin-1", ""]
    ),
)
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_raw_body_fuzz_finds_no_server_error(
    guarded_api: TestClient, path: str, raw: bytes, content_type: str
) -> None:
    """Bytes, not schema-valid bodies: random binary, random JSON, a valid body with bytes
    inserted or cut, UTF-16. Anything valid reaches admission and gets the key's 429."""
    headers = {**FUZZ_HEADERS, "content-type": content_type}
    response = guarded_api.post(path, content=raw, headers=headers)
    assert_client_error(response, path)
