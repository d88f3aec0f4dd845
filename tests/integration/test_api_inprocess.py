"""The API app in-process against a real Redis (no worker): auth, ownership, schema, errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as response_params

from tokenrelay.api import app as api_app
from tokenrelay.api.app import create_app
from tokenrelay.api.errors import POOL_EXHAUSTED_MESSAGE, retry_headers
from tokenrelay.api.openai.field_support import NO_EFFECT, REFUSED, SUPPORT_KEY
from tokenrelay.shared.errors import InvalidRequest, Overloaded, QuotaExceeded
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts, scripts
from tokenrelay.shared.redis.rq_jobs import generation_queue
from tokenrelay.shared.redis.scripts import AsyncScripts, ScriptCall, SyncScripts
from tokenrelay.shared.settings import Settings

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def keyed_client(redis_url: str) -> Iterator[TestClient]:
    settings = Settings(redis_url=redis_url, api_keys=["key-a", "key-b"], served_model_name="m")
    with TestClient(create_app(settings)) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_missing_or_wrong_key_is_401_in_openai_shape(keyed_client: TestClient) -> None:
    for headers in ({}, bearer("nope"), {"Authorization": "Basic a2V5LWE="}):
        response = keyed_client.get("/v1/models", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert keyed_client.get("/v1/models", headers=bearer("key-a")).status_code == 200


def test_a_key_only_sees_its_own_jobs(keyed_client: TestClient) -> None:
    body = {"model": "m", "messages": MESSAGES}
    created = keyed_client.post("/v1/jobs", json=body, headers=bearer("key-a"))
    assert created.status_code == 202
    job_id = created.json()["id"]
    assert created.json()["status"] == "queued"
    assert keyed_client.get(f"/v1/jobs/{job_id}", headers=bearer("key-a")).status_code == 200
    for method in ("GET", "DELETE"):
        other = keyed_client.request(method, f"/v1/jobs/{job_id}", headers=bearer("key-b"))
        assert other.status_code == 404
        assert "hi" not in other.text
    events = keyed_client.get(f"/v1/jobs/{job_id}/events", headers=bearer("key-b"))
    assert events.status_code == 404


def test_job_events_are_the_logged_payloads_with_their_seq_and_type(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    settings = Settings(redis_url=redis_url, served_model_name="m")
    text = 'h\u00e9 "quoted"\n\U0001f30a'
    usage = Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)
    events = [
        Started(seq=0, worker="w", prompt_tokens=3),
        TokenChunk(seq=1, text=text, tokens=1),
        Done(seq=2, finish_reason="stop", usage=usage),
    ]
    with TestClient(create_app(settings)) as client:
        job_id = client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).json()["id"]
        run = SyncScripts(sync_redis)
        run.run(job_scripts.start(settings, job_id, "w", events[0].to_wire()))
        run.run(plane_scripts.emit(settings, [(job_id, 1, events[1].to_wire())]))
        run.run(job_scripts.finish(settings, job_id, "succeeded", {}, events[2].to_wire()))
        response = client.get(f"/v1/jobs/{job_id}/events")
        created, started_at = sync_redis.hmget(keys.job(job_id), "created_at", "started_at")
    assert response.status_code == 200
    assert created is not None and started_at is not None
    wire = [(event, event.model_dump_json(exclude_none=True)) for event in events]
    queue_wait = float(started_at) - float(created)  # START adds it, formatted so
    wire[0] = (events[0], wire[0][1][:-1] + f',"queue_wait_s":{queue_wait:.6f}}}')
    expected = "".join(f"id: {e.seq}\nevent: {e.type}\ndata: {data}\n\n" for e, data in wire)
    assert response.content == expected.encode()


def test_api_keys_setting_accepts_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENRELAY_API_KEYS", "a, b,,c")
    assert Settings().api_keys == ["a", "b", "c"]


def test_openapi_schema_lists_the_http_surface(redis_url: str) -> None:
    schema = create_app(Settings(redis_url=redis_url)).openapi()
    paths = schema["paths"]
    assert set(paths) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/",
        "/chat",
        "/v1/models",
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/events",
        "/v1/cluster",
        "/v1/models/{model_id}",
        "/healthz",
        "/health",
        "/readyz",
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/cancel",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel",
        "/v1/responses/{response_id}/input_items",
    }
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert set(paths["/v1/jobs/{job_id}"]) == {"get", "delete"}
    assert set(paths["/v1/files"]) == {"get", "post"}
    assert set(paths["/v1/files/{file_id}"]) == {"get", "delete"}
    assert set(paths["/v1/batches"]) == {"get", "post"}
    upload = paths["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert upload["schema"]["required"] == ["file", "purpose"]
    assert (
        "application/octet-stream"
        in paths["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"]
    )
    batch = schema["components"]["schemas"]["Batch"]
    assert {"request_counts", "output_file_id", "error_file_id", "errors", "webhook"} <= set(
        batch["properties"]
    )
    batch_create = schema["components"]["schemas"]["BatchCreate"]
    assert batch_create["additionalProperties"] is False
    assert set(batch_create["properties"]) == {
        "input_file_id",
        "endpoint",
        "completion_window",
        "metadata",
        "webhook",
    }
    assert batch_create["properties"]["webhook"]["anyOf"][0]["maxLength"] == 2048
    request_schema = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages", "max_tokens", "stream", "stop", "seed"} <= set(
        request_schema["properties"]
    )
    article_body = paths["/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"prompt", "stream"} <= set(article_body["properties"])  # so schemathesis fuzzes it
    job_schema = schema["components"]["schemas"]["JobRecord"]
    assert {"id", "status", "text", "usage", "error", "webhook", "webhook_events_filter"} <= set(
        job_schema["properties"]
    )
    assert {"attempts", "workers"} <= set(job_schema["properties"])


@pytest.mark.parametrize(
    ("schema_name", "params"),
    [
        ("ChatCompletionRequest", chat_params.CompletionCreateParamsBase),
        ("CompletionRequest", completion_params.CompletionCreateParamsBase),
    ],
)
def test_every_openai_request_field_is_declared_implemented_or_refused(
    redis_url: str, schema_name: str, params: type
) -> None:
    """The schema names each field of openai-python's request types: none can vanish."""
    schema = create_app(Settings(redis_url=redis_url)).openapi()["components"]["schemas"]
    request = schema[schema_name]
    assert request["additionalProperties"] is False
    openai_fields = set(params.__annotations__) - {"stream"}
    assert openai_fields <= set(request["properties"]), openai_fields - set(request["properties"])
    marks = {name: prop.get(SUPPORT_KEY) for name, prop in request["properties"].items()}
    assert set(marks.values()) <= {None, REFUSED, NO_EFFECT}
    assert marks["messages" if schema_name == "ChatCompletionRequest" else "prompt"] is None
    assert marks["user"] == NO_EFFECT


def test_every_openai_responses_field_is_declared_implemented_no_effect_or_refused(
    redis_url: str,
) -> None:
    """The schema names each field of openai-python's `responses.create`: none can vanish."""
    schema = create_app(Settings(redis_url=redis_url)).openapi()["components"]["schemas"]
    request = schema["ResponseRequest"]
    assert request["additionalProperties"] is False
    openai_fields = set(response_params.ResponseCreateParamsBase.__annotations__)
    assert openai_fields <= set(request["properties"]), openai_fields - set(request["properties"])
    marks = {name: prop.get(SUPPORT_KEY) for name, prop in request["properties"].items()}
    assert set(marks.values()) <= {None, REFUSED, NO_EFFECT}
    assert {name for name, mark in marks.items() if mark == NO_EFFECT} == {
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "reasoning",
        "include",
        "client_metadata",
    }
    assert marks["conversation"] == REFUSED
    for honoured in ("input", "instructions", "tools", "text", "store", "background", "truncation"):
        assert marks[honoured] is None, honoured


def test_the_schema_shows_tools_implemented_for_chat_and_refused_for_jobs(
    redis_url: str,
) -> None:
    schema = create_app(Settings(redis_url=redis_url)).openapi()["components"]["schemas"]
    for name in ("tools", "tool_choice", "parallel_tool_calls"):
        assert SUPPORT_KEY not in schema["ChatCompletionRequest"]["properties"][name]
        assert schema["JobRequest"]["properties"][name][SUPPORT_KEY] == REFUSED
    assert schema["ChatCompletionRequest"]["properties"]["functions"][SUPPORT_KEY] == REFUSED
    message = schema["InputMessage"]["properties"]
    assert "tool" in message["role"]["enum"]
    assert {"tool_calls", "tool_call_id"} <= set(message)


def test_readyz_is_503_when_redis_is_unreachable() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "redis_unavailable"
        chat = client.post(
            "/v1/chat/completions", json={"model": settings.model_id, "messages": MESSAGES}
        )
        assert chat.status_code == 503
        assert chat.json()["error"]["code"] == "redis_unavailable"
        assert chat.headers["Retry-After"] == "1"
        assert 500 <= int(chat.headers["retry-after-ms"]) <= 1500
        assert client.get("/health").status_code == 503


def test_retry_after_ms_is_jittered_around_retry_after() -> None:
    """So the clients one instant refuses do not all come back in the same instant."""
    values = set()
    for _ in range(50):
        headers = retry_headers(Overloaded("full", retry_after_s=2))
        assert headers is not None and headers["Retry-After"] == "2"
        values.add(int(headers["retry-after-ms"]))
    assert len(values) > 10
    assert all(1000 <= value <= 3000 for value in values)
    assert retry_headers(QuotaExceeded("key at its limit")) is not None
    assert retry_headers(InvalidRequest("bad")) is None


def test_a_job_that_can_never_fit_a_batch_is_refused_at_admission(redis_url: str) -> None:
    settings = Settings(
        redis_url=redis_url,
        served_model_name="m",
        worker_max_batch_tokens=100,
        default_max_tokens=50,
    )
    with TestClient(create_app(settings)) as client:
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 100}
        response = client.post("/v1/jobs", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "max_tokens"
        assert "WORKER_MAX_BATCH_TOKENS" in response.json()["error"]["message"]


def test_every_operation_documents_its_error_responses(redis_url: str) -> None:
    schema = create_app(Settings(redis_url=redis_url)).openapi()
    assert "ErrorBody" in schema["components"]["schemas"]
    for path, operations in schema["paths"].items():
        if path in ("/healthz", "/health", "/readyz"):
            continue
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            unavailable = "529" if path.startswith("/v1/messages") else "503"  # Anthropic's
            assert {"401", unavailable} <= statuses, f"{method.upper()} {path}: {statuses}"
            if method == "post":
                assert "400" in statuses, f"{method.upper()} {path}: {statuses}"
            # (a stored response's routes and the token count admit no job)
            admits = not path.startswith(("/v1/files", "/v1/batches", "/v1/responses/"))
            if method == "post" and admits:
                assert "429" in statuses, f"{method.upper()} {path}: {statuses}"  # admits a job


def test_a_running_job_reads_its_text_so_far_from_its_log_and_an_ended_one_from_finish(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    settings = Settings(redis_url=redis_url, served_model_name="m")
    started = Started(seq=0, worker="w", prompt_tokens=3).to_wire()
    chunks = [TokenChunk(text=text, tokens=1).to_wire() for text in ("héllo", " 🌊")]
    usage = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    done = Done(finish_reason="stop", usage=usage).to_wire()
    with TestClient(create_app(settings)) as client:
        job_id = client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).json()["id"]
        run = SyncScripts(sync_redis)
        run.run(job_scripts.start(settings, job_id, "w", started))
        run.run(plane_scripts.emit(settings, [(job_id, 1, chunks[0]), (job_id, 2, chunks[1])]))
        running = client.get(f"/v1/jobs/{job_id}").json()
        assert (running["status"], running["text"]) == ("running", "héllo 🌊")
        fields: dict[str, scripts.Arg] = {"finish_reason": "stop"}
        ended = job_scripts.finish(
            settings, job_id, "succeeded", fields, done, 3, "the stored text"
        )
        assert run.run(ended) == 1
        finished = client.get(f"/v1/jobs/{job_id}").json()
    assert (finished["status"], finished["text"]) == ("succeeded", "the stored text")


def test_a_request_that_finds_no_free_redis_connection_gets_a_503_that_says_so(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "cannot reach Redis" when Redis is fine and the process's pool is all in use."""
    monkeypatch.setattr(api_app, "REDIS_POOL_WAIT_S", 0.2)
    settings = Settings(redis_url=redis_url, served_model_name="m", redis_pool_size=2)
    with TestClient(create_app(settings)) as client:
        job_id = client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).json()["id"]
        pool = client.app.state.tokenrelay.redis.connection_pool  # type: ignore[attr-defined]
        assert client.portal is not None
        held = [client.portal.call(pool.get_connection) for _ in range(2)]
        try:
            response = client.get(f"/v1/jobs/{job_id}")
        finally:
            for connection in held:
                client.portal.call(pool.release, connection)
        assert response.status_code == 503
        assert response.json()["error"]["message"] == POOL_EXHAUSTED_MESSAGE
        assert response.headers["Retry-After"] == "1"
        assert client.get(f"/v1/jobs/{job_id}").status_code == 200


def test_an_admission_whose_reply_is_lost_leaves_no_job_queued(
    redis_url: str, sync_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis ran ADMIT (the job and its queue entry are there) but the reply never came: the
    client gets a 503, and the job is ended rather than run for nobody."""
    original = AsyncScripts.run

    async def reply_lost(self: AsyncScripts, call: ScriptCall) -> object:
        reply = await original(self, call)
        if call.source == job_scripts.ADMIT:
            raise redis.ConnectionError("Connection closed by server.")
        return reply

    monkeypatch.setattr(AsyncScripts, "run", reply_lost)
    settings = Settings(redis_url=redis_url, served_model_name="m")
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 503
    [job_id] = sync_redis.lrange(keys.recent_jobs(), 0, -1)
    assert sync_redis.hget(keys.job(job_id), "status") == "cancelled"
    assert sync_redis.llen(generation_queue(sync_redis, "m", "normal").key) == 0
    assert sync_redis.zscore(keys.leases(), job_id) is None


def test_a_refused_chat_leaves_its_api_process_hearing_nothing_for_it(redis_url: str) -> None:
    """A streamed chat heard from before its admission (`StreamHub.expect`) and then refused
    at admission (503, the global limit) is forgotten: the hub keeps no reader of it."""
    settings = Settings(redis_url=redis_url, served_model_name="m", max_inflight=1)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).status_code == 202
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        refused = client.post("/v1/chat/completions", json=body)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "cluster_overloaded"
        hub = client.app.state.tokenrelay.hub  # type: ignore[attr-defined]
        assert hub.channel_count == 0 and not hub._expected
