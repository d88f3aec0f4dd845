"""What dies on the way: workers killed or stopped, queue waits running out, Redis restarting.

Each test runs its own Redis, API and workers (real processes), so it can kill them.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.rq_jobs import generation_queue
from tokenrelay.testing.polling import eventually

LEASE_TTL_S = 2
LONG = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "go"}],
    "max_tokens": 1800,
    "min_tokens": 1800,
}
SHORT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "go"}], "max_tokens": 8}


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:  # type: ignore[override]
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def cluster(redis_server: EmbeddedRedis, make_cluster: ClusterFactory) -> Cluster:
    settings = {
        "TOKENRELAY_LEASE_TTL_S": str(LEASE_TTL_S),
        "TOKENRELAY_MAX_QUEUE_WAIT_S": "60",
        "TOKENRELAY_WORKER_CONCURRENCY": "1",
        # One attempt: a lost job ends as these tests check, not continued
        # (test_continuation.py).
        "TOKENRELAY_JOB_MAX_ATTEMPTS": "1",
    }
    return make_cluster(settings, redis_url=redis_server.url, workers=0, api_workers=0)


def read_events(http: httpx.Client, job_id: str) -> list[dict]:
    with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def wait_for_token(http: httpx.Client, job_id: str) -> None:
    with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["type"] == "token":
                return
    raise AssertionError("the job ended before its first token")


def lease_count(cluster: Cluster) -> int:
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        return int(client.zcard(keys.leases()))
    finally:
        client.close()


def test_worker_killed_mid_stream_fails_the_job_and_queued_jobs_survive(cluster: Cluster) -> None:
    worker = cluster.start_worker()
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        body = {**LONG, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = (line for line in stream.iter_lines() if line.startswith("data: "))
            first = json.loads(next(lines)[6:])
            running = first["id"].removeprefix("chatcmpl-")
            wait_for_token(http, running)
            queued = http.post("/v1/jobs", json=SHORT).json()["id"]
            worker.kill()
            killed_at = time.monotonic()
            rest = list(lines)
        detected_s = time.monotonic() - killed_at
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["error"]["code"] == "worker_lost"
        assert detected_s <= LEASE_TTL_S + 2
        record = http.get(f"/v1/jobs/{running}").json()
        assert record["status"] == "failed"
        assert record["error"]["type"] == "worker_lost"
        connection = redis.Redis.from_url(cluster.redis_url)
        failed = FailedJobRegistry(queue=generation_queue(connection, MODEL_NAME, "normal"))
        # The reaper moves it right after marking it failed.
        eventually(lambda: running in failed.get_job_ids(cleanup=False), 5, "RQ's failed registry")
        connection.close()
        cluster.start_worker()
        assert read_events(http, queued)[-1]["type"] == "done"
    assert lease_count(cluster) == 0


def test_sigterm_drains_running_jobs_then_exits_0_and_keeps_queued_ones(
    cluster: Cluster,
) -> None:
    cluster.settings["TOKENRELAY_WORKER_DRAIN_S"] = "1"
    worker = cluster.start_worker()
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        running = http.post("/v1/jobs", json=LONG).json()["id"]
        queued = http.post("/v1/jobs", json=SHORT).json()["id"]
        wait_for_token(http, running)
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        record = http.get(f"/v1/jobs/{running}").json()
        assert record["status"] == "failed"
        assert "drain" in record["error"]["message"]
        assert http.get(f"/v1/jobs/{queued}").json()["status"] == "queued"
        cluster.settings["TOKENRELAY_WORKER_DRAIN_S"] = "60"
        patient = cluster.start_worker()
        short = http.post("/v1/jobs", json=SHORT).json()["id"]
        wait_for_token(http, short)
        patient.signal(signal.SIGTERM)
        assert patient.wait(30) == 0
        assert read_events(http, queued)[-1]["type"] == "done"
        assert read_events(http, short)[-1]["type"] == "done"
    assert lease_count(cluster) == 0


def test_job_not_started_within_the_queue_wait_expires(cluster: Cluster) -> None:
    cluster.settings["TOKENRELAY_MAX_QUEUE_WAIT_S"] = "1"
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        job_id = http.post("/v1/jobs", json=SHORT).json()["id"]
        events = read_events(http, job_id)
        assert events[-1]["type"] == "error" and events[-1]["error_type"] == "expired"
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "expired"
        assert lease_count(cluster) == 0
        cluster.start_worker()
        later = http.post("/v1/jobs", json=SHORT).json()["id"]
        assert read_events(http, later)[-1]["type"] == "done"
        record = http.get(f"/v1/jobs/{job_id}").json()
        assert record["status"] == "expired" and record["started_at"] is None


def test_redis_restart_gives_503_then_recovers_without_restarts(
    cluster: Cluster, redis_server: EmbeddedRedis
) -> None:
    cluster.start_worker()
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        assert (
            read_events(http, http.post("/v1/jobs", json=SHORT).json()["id"])[-1]["type"] == "done"
        )
        redis_server.stop()
        assert http.get("/readyz").status_code == 503
        started = time.monotonic()
        refused = http.post("/v1/chat/completions", json=SHORT)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "redis_unavailable"
        assert time.monotonic() - started < 5
        redis_server.start()
        eventually(lambda: http.get("/readyz").status_code == 200, 30, "the API to reconnect")
        response = http.post("/v1/chat/completions", json=SHORT, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_worker_paused_past_its_lease_leaves_its_job_failed_in_rq_only(cluster: Cluster) -> None:
    worker = cluster.start_worker()
    cluster.start_api()
    connection = redis.Redis.from_url(cluster.redis_url)
    queue = generation_queue(connection, MODEL_NAME, "normal")
    failed, finished = FailedJobRegistry(queue=queue), FinishedJobRegistry(queue=queue)
    assert worker.log_path is not None
    log_path = worker.log_path
    try:
        with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
            job_id = http.post("/v1/jobs", json=LONG).json()["id"]
            wait_for_token(http, job_id)
            worker.signal(signal.SIGSTOP)
            eventually(
                lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "failed",
                30,
                "the reaper to fail the paused worker's job",
            )
            worker.signal(signal.SIGCONT)
            eventually(
                lambda: "WorkerLost" in log_path.read_text(errors="replace"),
                30,
                "the resumed worker to give the job up",
            )
            events = read_events(http, job_id)
        assert [e["type"] for e in events].count("error") == 1
        assert events[-1]["error_type"] == "worker_lost"
        assert job_id in failed.get_job_ids(cleanup=False)
        assert job_id not in finished.get_job_ids(cleanup=False)
        assert worker.running()
    finally:
        connection.close()
    assert lease_count(cluster) == 0
