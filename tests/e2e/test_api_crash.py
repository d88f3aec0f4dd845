"""An API process killed (SIGKILL) mid-stream: its job runs on to completion.

Nothing is left that knows the client went away, and nothing needs to: the worker holds and
renews the job's lease, so the slot stays counted until the job ends and is released then.
The client (or another one) can still fetch the result through any other API process, by
the job id in every chunk's `id` (`chatcmpl-<job id>`).
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import redis

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.shared.redis import keys

LEASE_TTL_S = 2
TOKENS = 600
LONG = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "go"}],
    "max_tokens": TOKENS,
    "min_tokens": TOKENS,
    "stream": True,
}


@pytest.fixture
def cluster(make_cluster: ClusterFactory) -> Cluster:
    return make_cluster({"TOKENRELAY_LEASE_TTL_S": str(LEASE_TTL_S)}, workers=0, api_workers=0)


class LeaseWatch:
    """Samples the lease set until stopped; records the longest a lease reached past now."""

    def __init__(self, redis_url: str) -> None:
        self._client = redis.Redis.from_url(redis_url, decode_responses=True)
        self._stop = threading.Event()
        self.longest_ahead_ms = 0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            with self._client.pipeline(transaction=False) as pipe:
                pipe.time()
                pipe.zrange(keys.leases(), 0, -1, withscores=True)
                (seconds, micros), leases = pipe.execute()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            for _, expiry_ms in leases:
                self.longest_ahead_ms = max(self.longest_ahead_ms, int(expiry_ms) - now_ms)
            self.samples += 1


def test_killed_api_leaves_its_job_running_and_fetchable_elsewhere(cluster: Cluster) -> None:
    cluster.start_worker()
    doomed = cluster.start_api()
    doomed_url = cluster.base_url
    cluster.start_api()
    survivor_url = cluster.base_url
    with (
        httpx.Client(base_url=survivor_url, timeout=30) as survivor,
        httpx.Client(base_url=doomed_url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=LONG) as stream,
    ):
        lines = stream.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        job_id = first["id"].removeprefix("chatcmpl-")
        with LeaseWatch(cluster.redis_url) as watch:  # the job runs: only renewed leases
            doomed.kill()
            with pytest.raises(httpx.TransportError):
                for _ in lines:
                    pass
            with survivor.stream("GET", f"/v1/jobs/{job_id}/events") as events:
                data = [json.loads(ln[6:]) for ln in events.iter_lines() if ln[:6] == "data: "]
            record = survivor.get(f"/v1/jobs/{job_id}").json()
    assert data[-1]["type"] == "done"
    assert record["status"] == "succeeded"
    assert record["usage"]["completion_tokens"] == TOKENS
    assert record["text"] == "".join(e["text"] for e in data if e["type"] == "token")
    assert watch.samples > 10
    assert watch.longest_ahead_ms <= LEASE_TTL_S * 1000
    client_redis = redis.Redis.from_url(cluster.redis_url)
    try:
        assert client_redis.zcard(keys.leases()) == 0
    finally:
        client_redis.close()
