"""Placement by prefix with real API and worker processes and a Redis with AOF on: a follow-up
goes to the own queue of the worker that ran its prefix, and nothing strands there when that
worker is killed (SIGKILL: swept once its heartbeat expires) or told to stop (SIGTERM: handed
over at once, while it still drains its running job)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.redis import keys, placement
from tokenrelay.testing.polling import eventually

pytestmark = pytest.mark.timeout(240)

LONG = "The quick brown fox jumps over the lazy dog near the quiet river bank. " * 6
MESSAGES = [{"role": "user", "content": LONG}]
SHORT = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4}
LONG_RUNNING = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 1500, "min_tokens": 1500}


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:  # type: ignore[override]
    with EmbeddedRedis(persistent=True) as server:
        yield server


@pytest.fixture
def cluster(redis_server: EmbeddedRedis, make_cluster: ClusterFactory) -> Cluster:
    settings = {
        "TOKENRELAY_LEASE_TTL_S": "2",
        "TOKENRELAY_WORKER_CONCURRENCY": "1",
        "TOKENRELAY_JOB_MAX_ATTEMPTS": "1",
        "TOKENRELAY_WORKER_DRAIN_S": "120",
        "TOKENRELAY_FLUSH_INTERVAL_MS": "0",
    }
    return make_cluster(settings, redis_url=redis_server.url, workers=0, api_workers=0)


def record(http: httpx.Client, job_id: str) -> dict[str, Any]:
    return dict(http.get(f"/v1/jobs/{job_id}").json())


def finished(http: httpx.Client, job_id: str) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def ended() -> bool:
        seen.append(record(http, job_id))
        return seen[-1]["status"] not in ("queued", "running")

    eventually(ended, 60, f"job {job_id} to end")
    return seen[-1]


def submit(http: httpx.Client, body: dict[str, Any]) -> str:
    response = http.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def placed_behind_a_busy_worker(cluster: Cluster, http: httpx.Client) -> tuple[str, str, str]:
    """The first worker, A, runs a prompt, then a long job with the same prefix (placed on A,
    which runs it); a follow-up with that prefix is placed on A and waits in A's own queue
    while a second worker idles. Returns A's name, the long job's id and the follow-up's."""
    name = finished(http, submit(http, SHORT))["workers"][0]
    cluster.start_worker()
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    listed = keys.placement_workers(MODEL_NAME)
    eventually(lambda: client.zcard(listed) == 2, 30, "both workers to be listed for placement")
    busy = submit(http, LONG_RUNNING)
    eventually(lambda: record(http, busy)["status"] == "running", 30, "the long job to start")
    assert record(http, busy)["workers"] == [name]
    follow_up = submit(http, SHORT)
    own = placement.worker_queue_keys(name)[1]
    assert client.lpos(own, follow_up) is not None  # placed on A, which is busy
    assert record(http, follow_up)["status"] == "queued"
    client.close()
    return name, busy, follow_up


def test_a_killed_workers_own_queue_is_handed_to_the_shared_queue_and_runs_elsewhere(
    cluster: Cluster,
) -> None:
    first = cluster.start_worker()
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        name, _, follow_up = placed_behind_a_busy_worker(cluster, http)
        first.kill()
        cluster.group.remove(first)
        ended = finished(http, follow_up)
    assert ended["status"] == "succeeded"
    assert ended["workers"] != [name]
    with redis.Redis.from_url(cluster.redis_url) as client:
        assert client.zscore(keys.placement_workers(MODEL_NAME), name) is None
        assert not any(client.exists(key) for key in placement.worker_queue_keys(name))


def test_a_stopped_worker_hands_its_own_queue_over_at_once_while_it_drains(
    cluster: Cluster,
) -> None:
    first = cluster.start_worker()
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        name, busy, follow_up = placed_behind_a_busy_worker(cluster, http)
        first.signal(signal.SIGTERM)
        ended = finished(http, follow_up)
        assert ended["status"] == "succeeded"
        assert ended["workers"] != [name]
        assert record(http, busy)["status"] == "running"  # the hand-off did not wait for it
        assert first.running()
        with redis.Redis.from_url(cluster.redis_url) as client:
            assert client.zscore(keys.placement_workers(MODEL_NAME), name) is None
        assert http.delete(f"/v1/jobs/{busy}").status_code in (200, 202)
        assert first.wait(60) == 0
