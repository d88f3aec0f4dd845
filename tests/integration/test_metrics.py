"""`/metrics` and the request log: in-process against a real Redis, and end to end through
`tokenrelay api --workers 2` (prometheus-client's multiprocess mode) with a real worker."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from fastapi.testclient import TestClient
from rq import Queue, Worker

from tests.support.metrics import Samples, parse, value
from tokenrelay.api.api_keys import hash_key, owner_id
from tokenrelay.api.app import create_app
from tokenrelay.api.cluster_view import ClusterGauges
from tokenrelay.api.metrics import Metrics
from tokenrelay.api.middleware.request_log import LOGGER_NAME, RequestRecord, recording
from tokenrelay.api.streaming.hub import Delivery, StreamItem
from tokenrelay.api.streaming.observer import observe_events
from tokenrelay.cli.main import _prometheus_multiproc_dir
from tokenrelay.shared.events import Done, Error, Event, Started, TokenChunk, Usage
from tokenrelay.shared.redis import keys
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.rq_worker import build_worker

SECRET = "the launch code is 0000"
MESSAGES = [{"role": "user", "content": SECRET}]


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    return parse(response.text)[1]


@pytest.fixture
def client(redis_url: str) -> Iterator[TestClient]:
    settings = Settings(
        redis_url=redis_url, served_model_name="m", max_inflight=1, max_request_bytes=4096
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_scrape_is_prometheus_text_with_every_documented_family(client: TestClient) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    names, samples = parse(response.text)
    assert {
        "tokenrelay_requests",
        "tokenrelay_rejections",
        "tokenrelay_queue_wait_seconds",
        "tokenrelay_time_to_first_token_seconds",
        "tokenrelay_inter_token_latency_seconds",
        "tokenrelay_e2e_request_latency_seconds",
        "tokenrelay_prompt_tokens",
        "tokenrelay_generation_tokens",
        "tokenrelay_requests_in_flight",
        "tokenrelay_requests_in_flight_limit",
        "tokenrelay_queue_depth",
        "tokenrelay_workers",
        "tokenrelay_job_migrations",
        "tokenrelay_redis_up",
    } <= names
    assert value(samples, "tokenrelay_redis_up") == 1
    assert value(samples, "tokenrelay_requests_in_flight_limit") == 1
    assert value(samples, "tokenrelay_workers") == 0
    assert value(samples, "tokenrelay_job_migrations_total") == 0
    assert "/metrics" not in client.app.openapi()["paths"]  # type: ignore[attr-defined]


def test_requests_and_rejections_are_counted_by_endpoint_status_and_error_type(
    client: TestClient,
) -> None:
    body = {"model": "m", "messages": MESSAGES}
    job_id = client.post("/v1/jobs", json=body).json()["id"]
    assert client.post("/v1/jobs", json=body).status_code == 503  # max_inflight=1
    assert client.post("/v1/chat/completions", json={"model": "m"}).status_code == 400
    assert client.post("/v1/chat/completions", json={**body, "model": "x"}).status_code == 404
    huge = {**body, "messages": [{"role": "user", "content": "x" * 5000}]}
    assert client.post("/v1/chat/completions", json=huge).status_code == 413
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    assert client.get("/v1/jobs/0123abc").status_code == 404  # not a generation: no rejection
    client.get("/metrics")  # scrapes are not counted
    samples = scrape(client)
    assert value(samples, "tokenrelay_requests_total", endpoint="/v1/jobs", status="202") == 1
    assert value(samples, "tokenrelay_requests_total", endpoint="/v1/jobs", status="503") == 1
    chat = "/v1/chat/completions"
    assert value(samples, "tokenrelay_requests_total", endpoint=chat, status="400") == 1
    assert value(samples, "tokenrelay_requests_total", endpoint=chat, status="404") == 1
    too_large = {"endpoint": "unmatched", "status": "413"}  # refused before routing
    assert value(samples, "tokenrelay_requests_total", **too_large) == 1
    job = "/v1/jobs/{job_id}"
    assert value(samples, "tokenrelay_requests_total", endpoint=job, status="200") == 1
    assert value(samples, "tokenrelay_requests_total", endpoint=job, status="404") == 1
    assert not any(name == "tokenrelay_requests_total" and ("endpoint", "/metrics") in labels
                   for name, labels in samples)  # fmt: skip
    rejections = {
        dict(labels)["reason"]: count
        for (name, labels), count in samples.items()
        if name == "tokenrelay_rejections_total"
    }
    assert rejections == {
        "cluster_overloaded": 1,
        "invalid_request_error": 1,
        "model_not_found": 1,
        "request_too_large": 1,
    }


def test_in_flight_and_queue_depth_are_read_from_redis_at_scrape_time(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    assert value(scrape(client), "tokenrelay_requests_in_flight") == 0
    created = client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES})
    assert created.status_code == 202
    samples = scrape(client)
    assert value(samples, "tokenrelay_requests_in_flight") == 1
    queue = keys.generation_queue("m", "normal")
    assert value(samples, "tokenrelay_queue_depth", queue=queue) == 1
    # Leases taken by any process count: the gauge is the lease set, not this process's view.
    sync_redis.zadd(keys.leases(), {"elsewhere-1": 2**50, "elsewhere-2": 2**50})
    assert value(scrape(client), "tokenrelay_requests_in_flight") == 3


def test_only_tokenrelays_queues_and_workers_are_counted(
    client: TestClient, redis_url: str
) -> None:
    assert client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).status_code == 202
    connection = redis.Redis.from_url(redis_url)
    try:  # another application's RQ queue, with a job, and its worker, in the same Redis
        Queue("emails", connection=connection).enqueue_call("mailer.send")
        Worker(["emails"], name="mailer", connection=connection).register_birth()
        build_worker(connection, "tokenrelay-w1", {}, model="m").register_birth()
        samples = scrape(client)
    finally:
        connection.close()
    depths = {
        dict(labels)["queue"]: count
        for (name, labels), count in samples.items()
        if name == "tokenrelay_queue_depth"
    }
    assert depths == {  # every priority of the served model, none of another application's
        keys.generation_queue("m", priority): int(priority == "normal")
        for priority in ("high", "normal", "low")
    }
    assert value(samples, "tokenrelay_workers") == 1


def test_a_redis_outage_still_answers_the_scrape_with_what_it_knows() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings)) as client:
        body = {"model": settings.model_id, "messages": MESSAGES}
        assert client.post("/v1/jobs", json=body).status_code == 503
        response = client.get("/metrics")
    assert response.status_code == 200
    names, samples = parse(response.text)
    assert value(samples, "tokenrelay_redis_up") == 0
    assert "tokenrelay_requests_in_flight" not in names
    assert "tokenrelay_workers" not in names
    status = {"endpoint": "/v1/jobs", "status": "503"}
    assert value(samples, "tokenrelay_requests_total", **status) == 1
    assert value(samples, "tokenrelay_rejections_total", reason="redis_unavailable") == 1


def request_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER_NAME]


def test_one_json_log_line_per_request_with_key_id_and_no_prompt_text(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = Settings(redis_url=redis_url, served_model_name="m", api_keys=["sk-secret-key"])
    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": "Bearer sk-secret-key"}
        created = client.post(
            "/v1/jobs", json={"model": "m", "messages": MESSAGES}, headers=headers
        )
        assert created.status_code == 202
        assert client.get("/healthz").status_code == 200
    lines = request_lines(caplog)
    assert [line["path"] for line in lines] == ["/v1/jobs", "/healthz"]
    line = lines[0]
    assert line["job_id"] == created.json()["id"]
    assert line["key_id"] == owner_id(hash_key("sk-secret-key"), b"")  # no secret set
    assert (line["model"], line["status"], line["endpoint"]) == ("m", 202, "/v1/jobs")
    assert isinstance(line["duration_s"], float)
    assert "prompt" not in line
    probe = next(r for r in caplog.records if r.name == LOGGER_NAME and "/healthz" in r.message)
    assert probe.levelno == logging.DEBUG  # probes and scrapes stay out of the INFO log
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert "sk-secret-key" not in record.getMessage()


def test_log_prompts_setting_puts_the_prompt_in_the_log_line(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    settings = Settings(redis_url=redis_url, served_model_name="m", log_prompts=True)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).status_code == 202
    [line] = request_lines(caplog)
    assert line["prompt"] == MESSAGES


async def replay(events: list[Event]) -> AsyncIterator[StreamItem]:
    for event in events:
        yield Delivery(event, event.model_dump_json())


async def test_a_served_stream_feeds_the_latency_and_token_metrics(
    async_redis: redis.asyncio.Redis,
) -> None:
    await async_redis.hset(keys.job("j1"), mapping={"created_at": "100.0", "started_at": "100.25"})
    metrics = Metrics()
    record = RequestRecord("POST", "/v1/chat/completions", log_prompts=False, metrics=metrics)
    usage = Usage(prompt_tokens=7, completion_tokens=4, total_tokens=11)  # 1 silent: EOS
    events: list[Event] = [
        Started(seq=0, worker="w", prompt_tokens=7),
        TokenChunk(seq=1, text="a", tokens=1),
        TokenChunk(seq=2, text="bc", tokens=2),
        Done(seq=3, finish_reason="length", usage=usage),
    ]
    with recording(record):
        seen = [item async for item in observe_events(async_redis, "j1", replay(events))]
    assert [item.event for item in seen if isinstance(item, Delivery)] == events
    assert (record.prompt_tokens, record.completion_tokens) == (7, 4)
    assert (record.job_status, record.finish_reason, record.queue_wait_s) == (
        "succeeded",
        "length",
        0.25,
    )
    assert record.ttft_s is not None
    samples = parse((await metrics.render(ClusterGauges(max_inflight=1))).decode())[1]
    assert value(samples, "tokenrelay_queue_wait_seconds_sum") == 0.25
    assert value(samples, "tokenrelay_time_to_first_token_seconds_count") == 1
    assert value(samples, "tokenrelay_inter_token_latency_seconds_count") == 2  # per token
    assert value(samples, "tokenrelay_e2e_request_latency_seconds_count") == 1
    assert value(samples, "tokenrelay_generation_tokens_total") == 4
    assert value(samples, "tokenrelay_prompt_tokens_total") == 7


async def test_a_started_event_with_the_queue_wait_is_not_read_from_the_job_hash(
    async_redis: redis.asyncio.Redis,
) -> None:
    """START puts the queue wait in the Started event (one Redis for both planes); the hash
    here says otherwise, and is not read."""
    await async_redis.hset(keys.job("j2"), mapping={"created_at": "100.0", "started_at": "109.0"})
    metrics = Metrics()
    record = RequestRecord("POST", "/v1/chat/completions", log_prompts=False, metrics=metrics)
    usage = Usage(prompt_tokens=7, completion_tokens=1, total_tokens=8)
    events: list[Event] = [
        Started(seq=0, worker="w", prompt_tokens=7, queue_wait_s=0.125),
        TokenChunk(seq=1, text="a", tokens=1),
        Done(seq=2, finish_reason="length", usage=usage),
    ]
    with recording(record):
        [item async for item in observe_events(async_redis, "j2", replay(events))]
    assert record.queue_wait_s == 0.125
    samples = parse((await metrics.render(ClusterGauges(max_inflight=1))).decode())[1]
    assert value(samples, "tokenrelay_queue_wait_seconds_sum") == 0.125


async def test_an_error_event_sets_the_job_status_it_stands_for(
    async_redis: redis.asyncio.Redis,
) -> None:
    record = RequestRecord("POST", "/v1/chat/completions", log_prompts=False, metrics=Metrics())
    expired = Error(seq=0, error_type="expired", message="not started in time")
    with recording(record):
        assert [e async for e in observe_events(async_redis, "j2", replay([expired]))]
    assert (record.job_status, record.error_type) == ("expired", "expired")


def test_tokenrelay_api_empties_a_given_multiprocess_dir_of_stale_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale, unrelated = tmp_path / "counter_12345.db", tmp_path / "notes.txt"
    stale.write_bytes(b"\0" * 8)
    unrelated.write_text("kept")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with _prometheus_multiproc_dir():
        assert not stale.exists()
    assert unrelated.exists()
