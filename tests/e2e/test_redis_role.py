"""A Redis that turns replica (what a failover does to the old primary) or is loading its data:
readiness says so, and no process dies of it.

Real processes against a Redis made a replica of a second, empty one with `REPLICAOF`, then
a primary again with `REPLICAOF NO ONE`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.cli.harness import Child
from tokenrelay.testing.polling import eventually

SHORT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "go"}], "max_tokens": 8}


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:  # type: ignore[override]
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def other_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


def redis_up(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("tokenrelay_redis_up "):
            return float(line.split()[1])
    raise AssertionError("no tokenrelay_redis_up")


def wrote_readonly_error(worker: Child) -> bool:
    assert worker.log_path is not None
    return "READONLY" in worker.log_path.read_text(errors="replace").upper()


def test_a_replica_is_not_ready_and_the_worker_survives_readonly_errors(
    redis_server: EmbeddedRedis, other_server: EmbeddedRedis, make_cluster: ClusterFactory
) -> None:
    settings = {"TOKENRELAY_LEASE_TTL_S": "3", "TOKENRELAY_WORKER_CONCURRENCY": "1"}
    cluster: Cluster = make_cluster(settings, redis_url=redis_server.url, workers=1)
    worker = next(c for c in cluster.group.children if c.name == "worker")
    admin = redis.Redis.from_url(redis_server.url)
    try:
        with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
            assert http.get("/readyz").status_code == 200
            assert redis_up(http) == 1
            admin.replicaof("127.0.0.1", other_server.port)
            response = http.get("/readyz")
            assert response.status_code == 503
            assert "replica" in response.json()["error"]["message"]
            assert redis_up(http) == 0
            refused = http.post("/v1/chat/completions", json=SHORT)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "redis_unavailable"
            eventually(lambda: wrote_readonly_error(worker), 30, "the worker to meet READONLY")
            admin.replicaof("NO", "ONE")
            eventually(lambda: http.get("/readyz").status_code == 200, 30, "ready again")
            assert redis_up(http) == 1
            response = http.post("/v1/chat/completions", json=SHORT)
            assert response.status_code == 200, response.text
            assert json.loads(response.text)["choices"][0]["finish_reason"] in ("stop", "length")
        assert worker.running()
    finally:
        admin.close()
