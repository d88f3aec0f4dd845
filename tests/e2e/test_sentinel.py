"""Sentinel failover mid-traffic: every client follows the primary, and no accepted job is lost.

Real processes (an API, a worker) configured with `TOKENRELAY_REDIS_SENTINELS` and
`TOKENRELAY_REDIS_MIN_REPLICAS=1`, against a primary, a replica and three sentinels on free
ports; `SENTINEL FAILOVER` while clients submit jobs and stream. Every job accepted after
the promotion succeeds, and so does every job accepted before it, those running across the
promotion included: the processes follow the sentinels within a second of it
(`RedisConnector.follow_primary`), so no worker's lease renewals go on reaching the old
primary (which takes writes until the sentinels turn it into a replica) long enough for the
new one to reap its jobs.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually
from tokenrelay.testing.sentinel import SERVICE, EmbeddedSentinel

pytestmark = pytest.mark.timeout(300)
"""Each test starts a Sentinel group and a cluster, waits out a failover and its recovery:
past the default 120 s on a loaded 2-core box."""

RECOVERY_BOUND_S = 30.0
"""After the new primary takes writes, new requests succeed again within this
(docs/operations/sentinel.md): with
`MIN_REPLICAS=1` and one replica, that waits for the sentinels to turn the old primary into a
replica of the new one and for it to resync (about 15 s here)."""
SHORT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "go"}], "max_tokens": 8}
STREAM = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "go"}],
    "max_tokens": 300,
    "min_tokens": 300,
    "stream": True,
}


@pytest.fixture
def group() -> Iterator[EmbeddedSentinel]:
    with EmbeddedSentinel() as sentinel_group:
        yield sentinel_group


def _following(group: EmbeddedSentinel) -> dict[str, str]:
    """The settings that make a process follow the group's primary through its sentinels."""
    return {
        "TOKENRELAY_REDIS_SENTINELS": group.sentinels,
        "TOKENRELAY_REDIS_SENTINEL_MASTER": SERVICE,
    }


@dataclass
class Traffic:
    """Jobs submitted in a loop and `/readyz` sampled, each on a thread, until `stop`."""

    base_url: str
    accepted: list[tuple[float, str]] = field(default_factory=list)
    refused: list[tuple[float, str]] = field(default_factory=list)
    ready: list[tuple[float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def submit(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as http:
            while not self.stop.is_set():
                response = http.post("/v1/jobs", json=SHORT)
                if response.status_code == 202:
                    self.accepted.append((time.monotonic(), response.json()["id"]))
                else:
                    self.refused.append((time.monotonic(), response.json()["error"]["code"]))
                self.stop.wait(0.05)

    def sample(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as http:
            while not self.stop.is_set():
                self.ready.append((time.monotonic(), http.get("/readyz").status_code))
                self.stop.wait(0.05)


def stream_ending(base_url: str, ended: list[str], body: dict[str, object] = STREAM) -> None:
    """Append the stream's last line and its last event's error code or finish reason."""
    with (
        httpx.Client(base_url=base_url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    ended.append(lines[-1] if lines else "")
    if len(lines) > 1:
        last = json.loads(lines[-2][6:])
        ended.append(last.get("error", {}).get("code") or last["choices"][0]["finish_reason"])


def test_failover_mid_traffic_is_followed_and_loses_no_accepted_job(
    group: EmbeddedSentinel, make_cluster: ClusterFactory
) -> None:
    settings = _following(group) | {
        "TOKENRELAY_REDIS_MIN_REPLICAS": "1",
        "TOKENRELAY_LEASE_TTL_S": "6",
        "TOKENRELAY_WORKER_CONCURRENCY": "2",
        "OMP_NUM_THREADS": "1",
    }
    cluster: Cluster = make_cluster(settings, redis_url=group.url, workers=1)
    worker = next(c for c in cluster.group.children if c.name == "worker")
    traffic = Traffic(cluster.base_url)
    ended: list[str] = []
    threads = [
        threading.Thread(target=traffic.submit, daemon=True),
        threading.Thread(target=traffic.sample, daemon=True),
        threading.Thread(target=stream_ending, args=(cluster.base_url, ended), daemon=True),
    ]
    for thread in threads:
        thread.start()
    eventually(lambda: len(traffic.accepted) >= 10, 60, "jobs accepted before the failover")
    new_port = group.failover()
    promoted = time.monotonic()
    eventually(
        lambda: any(t > promoted for t, _ in traffic.accepted), RECOVERY_BOUND_S, "a new accept"
    )
    recovered_s = min(t for t, _ in traffic.accepted if t > promoted) - promoted
    eventually(
        lambda: sum(t > promoted for t, _ in traffic.accepted) >= 10, 60, "jobs accepted after"
    )
    traffic.stop.set()
    for thread in threads:
        thread.join(timeout=90)
    primary = redis.Redis(host="127.0.0.1", port=new_port, decode_responses=True)
    try:
        with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
            for _, job_id in traffic.accepted:
                record = http.get(f"/v1/jobs/{job_id}")
                assert record.status_code == 200, f"accepted job {job_id} lost"
            eventually(lambda: primary.zcard(keys.leases()) == 0, 60, "every job to end")
            records = [(t, http.get(f"/v1/jobs/{j}").json()) for t, j in traffic.accepted]
        statuses = {record["status"] for _, record in records}
        failed = [(t > promoted, r) for t, r in records if r["status"] != "succeeded"]
        assert failed == [], "(accepted after the promotion, record) of jobs that did not succeed"
        assert ended and ended[0] == "data: [DONE]", ended
        assert worker.running()
    finally:
        primary.close()
    print(
        f"failover: first accept {recovered_s:.2f}s after promotion; "
        f"{len(traffic.refused)} refused ({sorted(set(c for _, c in traffic.refused))}); "
        f"readyz 503 samples: {sum(code != 200 for _, code in traffic.ready)}; "
        f"statuses {statuses}"
    )


HUNG_PRIMARY_BOUND_S = 90.0
"""After the sentinels promote the replica of a primary that hangs, a job succeeds on the new
one within this: the worker's calls to the hung server time out (its 15 s socket timeout, once
per pooled connection: a job meeting one fails visibly) and reconnect to the new primary."""
API_RECOVERY_BOUND_S = 20.0
"""... and the same API process accepts a job within this (docs/operations/sentinel.md): a request
on a pooled connection to the hung server gives up after `TOKENRELAY_API_REDIS_TIMEOUT_S` (5 s) and
redis-py's retry reconnects to the primary the sentinels name, which moves the process's other pools
there too."""
SHORT_STREAM = SHORT | {"stream": True}


def _status(http: httpx.Client, job_id: str) -> str:
    """The job's status, or the error code of a request that could not read it."""
    body = http.get(f"/v1/jobs/{job_id}").json()
    return str(body.get("status") or body["error"]["code"])


def test_worker_and_api_leave_a_primary_that_hangs(
    group: EmbeddedSentinel, make_cluster: ClusterFactory
) -> None:
    """A frozen primary (SIGSTOP) never closes its connections nor answers on them: a worker
    blocked on one (RQ's dequeue, a lease renewal) must give up on it, or it stops taking jobs
    and every job queued on the new primary expires; an API must give up on its pooled
    connections and its pub/sub connection, or its requests and streams hang."""
    settings = _following(group) | {
        "TOKENRELAY_LEASE_TTL_S": "6",
        "TOKENRELAY_MAX_QUEUE_WAIT_S": "120",
        "OMP_NUM_THREADS": "1",
    }
    cluster: Cluster = make_cluster(settings, redis_url=group.url, workers=1)
    worker = next(c for c in cluster.group.children if c.name == "worker")
    api = next(c for c in cluster.group.children if c.name == "api")
    old = group.primary_port()
    try:
        with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
            first = http.post("/v1/jobs", json=SHORT).json()["id"]
            eventually(lambda: _status(http, first) == "succeeded", 60, "a job before the hang")
            before: list[str] = []
            stream_ending(cluster.base_url, before, SHORT_STREAM)  # the hub is subscribed once
            assert before[0] == "data: [DONE]", before
            group.servers[0].pause()
            group.promoted(old)
            promoted = time.monotonic()
            job_ids: list[str] = []

            def accepted() -> bool:
                response = http.post("/v1/jobs", json=SHORT)
                if response.status_code == 202:
                    job_ids.append(response.json()["id"])
                return bool(job_ids)

            eventually(accepted, API_RECOVERY_BOUND_S, "the same API to accept a job")
            accepted_s = time.monotonic() - promoted
            assert accepted_s <= API_RECOVERY_BOUND_S, accepted_s

            def one_succeeded() -> bool:
                """A job the worker took may still fail, on a pooled connection to the hung
                server that must time out first: submit another until one succeeds."""
                ended = [_status(http, j) for j in job_ids]
                if "succeeded" in ended:
                    return True
                if all(status in ("failed", "expired") for status in ended):
                    accepted()
                return False

            eventually(one_succeeded, HUNG_PRIMARY_BOUND_S, "a job to succeed on the new primary")
            statuses = [_status(http, j) for j in job_ids]
            after: list[str] = []
            stream_ending(cluster.base_url, after, SHORT_STREAM)
        assert "expired" not in statuses, statuses
        assert after[0] == "data: [DONE]" and after[1] in ("stop", "length"), after
        assert worker.running() and api.running()
    finally:
        group.servers[0].resume()
    print(f"hung primary: the same API accepted a job {accepted_s:.2f}s after the promotion")


ACROSS = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "go"}],
    "max_tokens": 300,
    "stream": True,
}
"""At the synthetic engine's 20 tokens/s, 15 s: it runs past the lease (6 s) after the
promotion, and past the sentinels' reconfiguration of the old primary (10 to 12 s after it)."""
LONGEST_GAP_S = 6.0
"""The most a stream across the promotion may go without a token: the processes move within
a second of it (`PRIMARY_CHECK_S`), the hub's pub/sub connection within the next second;
staying on the old primary until it is reconfigured cost 9.8 s."""


def test_a_stream_across_the_promotion_succeeds_whole_without_other_traffic(
    group: EmbeddedSentinel, make_cluster: ClusterFactory
) -> None:
    """No start or refused write tells the processes of the promotion (`MIN_REPLICAS=0`, one
    job): they learn of it by asking the sentinels. Before they did, the worker's lease
    renewals and events went to the old primary until it was reconfigured, the new one's
    lease ran out, and the job the client had watched to its end was recorded `worker_lost`."""
    settings = _following(group) | {
        "TOKENRELAY_LEASE_TTL_S": "6",
        "TOKENRELAY_ENGINE": "synthetic",
        "TOKENRELAY_ALLOW_SYNTHETIC_ENGINE": "1",
        "TOKENRELAY_SYNTHETIC_TOKENS_PER_S": "20",
    }
    cluster: Cluster = make_cluster(settings, redis_url=group.url, workers=1)
    texts: list[str] = []
    arrivals: list[float] = []
    job_ids: list[str] = []
    finish: list[str | None] = []
    running = threading.Event()

    def stream() -> None:
        with (
            httpx.Client(base_url=cluster.base_url, timeout=60) as http,
            http.stream("POST", "/v1/chat/completions", json=ACROSS) as response,
        ):
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    finish.append(chunk["error"]["code"])
                    continue
                job_ids.append(chunk["id"].removeprefix("chatcmpl-"))
                choice = chunk["choices"][0]
                if choice["delta"].get("content"):
                    texts.append(choice["delta"]["content"])
                    arrivals.append(time.monotonic())
                    running.set()
                finish.append(choice["finish_reason"])

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert running.wait(30), "the stream never started"
    group.failover()
    promoted = time.monotonic()
    reader.join(timeout=90)
    assert not reader.is_alive(), "the stream hung"
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        record = http.get(f"/v1/jobs/{job_ids[0]}").json()
    assert record["status"] == "succeeded", record
    assert finish[-1] == "length" and "".join(texts) == record["text"], (finish[-1:], record)
    assert arrivals[-1] - promoted > 8.0, "the stream ended before it could show anything"
    gap = max(b - a for a, b in itertools.pairwise(arrivals))
    assert gap <= LONGEST_GAP_S, f"a stream went {gap:.1f} s without a token"
    print(f"across the promotion: longest gap between tokens {gap:.2f} s")


def test_ends_waiting_for_a_frozen_replica_leave_leases_their_connections(
    group: EmbeddedSentinel, make_cluster: ClusterFactory
) -> None:
    """With `MIN_REPLICAS=1` and the replica frozen, each job's end waits out the failover
    guard's window (no replica acknowledges it; the sentinels still name the primary). The
    guard's `WAIT`s ran on the scripts pool and held it: in `bench.chaos --failover` the pool
    ran dry, lease renewals failed with "Too many connections", and running jobs lost their
    leases. Here three ends wait while a fourth job, running, needs its lease renewed."""
    settings = _following(group) | {
        "TOKENRELAY_REDIS_MIN_REPLICAS": "1",
        "TOKENRELAY_LEASE_TTL_S": "3",
        "TOKENRELAY_WORKER_CONCURRENCY": "4",
        "TOKENRELAY_WORKER_REDIS_POOL_SIZE": "3",
        "TOKENRELAY_ENGINE": "synthetic",
        "TOKENRELAY_ALLOW_SYNTHETIC_ENGINE": "1",
        "TOKENRELAY_SYNTHETIC_TOKENS_PER_S": "20",
    }
    cluster: Cluster = make_cluster(settings, redis_url=group.url, workers=1)
    worker = next(c for c in cluster.group.children if c.name == "worker")
    reasons: list[str] = []
    running = threading.Semaphore(0)

    def stream(max_tokens: int) -> None:
        body = ACROSS | {"max_tokens": max_tokens}
        last: dict[str, Any] = {}
        with (
            httpx.Client(base_url=cluster.base_url, timeout=60) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    if not last:
                        running.release()
                    last = json.loads(line[6:])
        reasons.append(last.get("error", {}).get("code") or last["choices"][0]["finish_reason"])

    # Three end 1.5 s in, while the replica is frozen; one runs 8 s, its 3 s lease renewed.
    threads = [threading.Thread(target=stream, args=(n,)) for n in (30, 30, 30, 160)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert running.acquire(timeout=30), "a job did not start"
    group.servers[1].pause()
    try:
        for thread in threads:
            thread.join(timeout=60)
    finally:
        group.servers[1].resume()
    assert sorted(reasons) == ["length"] * 4, reasons
    assert worker.running()
