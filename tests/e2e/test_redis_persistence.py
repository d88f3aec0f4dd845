"""Redis stopped mid-stream and restarted on the same append-only file: nothing is lost.

Real processes (an API, two workers) against a Redis run as compose.yaml runs it
(`appendonly yes`, `appendfsync everysec`). Redis is stopped with SIGTERM (it writes its
AOF) or SIGKILL (it loses up to its last second of writes, which the workers must resend)
while jobs stream, and started again on the same port and data directory. Streams open
across the outage carry on: their clients receive every token.
"""

from __future__ import annotations

import fnmatch
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.cli.harness import Child
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

STREAMS = 2
TOKENS = 400
SHORT_TOKENS = 200  # these end while Redis is down: their FINISH must wait for it
OUTAGE_S = 2.0
RQ_BOOKKEEPING_S = 15.0  # a bound on RQ finishing a job after tokenrelay has ended it
PERMANENT_RQ_KEYS = (
    "rq:queues",  # the set of queue names
    "rq:queue:*",  # each queue's list of job ids (and its intermediate list)
    "rq:workers",  # the set of worker keys, and one per queue; RQ prunes dead members
    "rq:workers:*",
    "rq:wip:*",  # the registries, sorted sets whose members carry their own expiry
    "rq:finished:*",
    "rq:failed:*",
    "rq:canceled:*",
    "rq:deferred:*",
    "rq:scheduled:*",
)
"""RQ's structures that live as long as their queue: no TTL, by design. Every other `rq:`
key (a job, its results, its executions, a worker) must expire."""


def body(tokens: int) -> dict:
    messages = [{"role": "user", "content": "go"}]
    return {"model": MODEL_NAME, "messages": messages, "max_tokens": tokens, "min_tokens": tokens}


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:  # type: ignore[override]
    with EmbeddedRedis(persistent=True) as server:
        yield server


@dataclass
class StreamClient:
    """A streaming chat completion on its own thread: the text it received, how it ended."""

    base_url: str
    job_id: str = ""
    text: str = ""
    ended: str = ""
    started: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        streaming = {**body(TOKENS), "stream": True}
        with (
            httpx.Client(base_url=self.base_url, timeout=60) as http,
            http.stream("POST", "/v1/chat/completions", json=streaming) as response,
        ):
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    self.ended = chunk["error"]["code"]
                    continue
                self.job_id = chunk["id"].removeprefix("chatcmpl-")
                self.started.set()
                choice = chunk["choices"][0]
                self.text += choice["delta"].get("content") or ""
                if choice.get("finish_reason"):
                    self.ended = choice["finish_reason"]


def token_events(http: httpx.Client, job_id: str) -> list[dict]:
    with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        if response.status_code != 200:
            raise AssertionError(f"{job_id}: {response.status_code} {response.read()!r}")
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def logged_tokens(client: redis.Redis, job_id: str) -> int:
    return int(client.xlen(keys.job_events(job_id)))


def keys_without_ttl(client: redis.Redis, pattern: str) -> list[str]:
    return sorted(
        key for key in client.scan_iter(match=pattern, count=1000) if client.ttl(key) == -1
    )


def check_no_key_leaked(client: redis.Redis) -> None:
    """No RQ key but RQ's permanent structures, and no job key, is left without a TTL; no
    started-job registry still lists a job."""
    assert next(client.scan_iter(match="rq:job:*"), None) is not None, "no RQ job kept"

    def leaked() -> list[str]:
        return [
            key
            for key in keys_without_ttl(client, "rq:*")
            if not any(fnmatch.fnmatchcase(key, p) for p in PERMANENT_RQ_KEYS)
        ]

    # RQ sets a job key's TTL in its own bookkeeping, just after tokenrelay's record ends.
    eventually(lambda: leaked() == [], RQ_BOOKKEEPING_S, "every RQ job key to get its TTL")
    assert keys_without_ttl(client, keys.job("*")) == []
    started = {key: client.zrange(key, 0, -1) for key in client.scan_iter(match="rq:wip:*")}
    assert all(not members for members in started.values()), started


def check_every_job(http: httpx.Client, client: redis.Redis, job_ids: list[str]) -> list[str]:
    """Each job ended exactly once; a succeeded one's stored text is its token events' text
    and its completion tokens are theirs. Returns the statuses."""
    statuses = []
    for job_id in job_ids:
        events = token_events(http, job_id)
        response = http.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, (job_id, response.text)
        record = response.json()
        assert [e.get("seq") for e in events] == list(range(len(events))), (job_id, events[-1:])
        assert sum(e["type"] in ("done", "error") for e in events) == 1, (job_id, record)
        tokens = [e for e in events if e["type"] == "token"]
        statuses.append(record["status"])
        if record["status"] == "succeeded":
            stored = client.get(keys.job_text(job_id)) or ""
            assert "".join(e["text"] for e in tokens) == stored == record["text"], job_id
            counted = sum(e["tokens"] for e in tokens)
            assert (
                counted
                == record["usage"]["completion_tokens"]
                == events[-1]["usage"]["completion_tokens"]
            ), job_id
            assert counted in (TOKENS, SHORT_TOKENS), job_id
    return statuses


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_redis_restart_mid_stream_loses_no_event_and_no_finished_job(
    redis_server: EmbeddedRedis, make_cluster: ClusterFactory, stop_signal: signal.Signals
) -> None:
    settings = {
        "TOKENRELAY_LEASE_TTL_S": "10",
        "TOKENRELAY_MAX_QUEUE_WAIT_S": "60",
        "TOKENRELAY_WORKER_CONCURRENCY": "4",
        "OMP_NUM_THREADS": "1",
    }
    cluster: Cluster = make_cluster(settings, redis_url=redis_server.url, workers=2)
    workers: list[Child] = [c for c in cluster.group.children if c.name == "worker"]
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    streams = [StreamClient(cluster.base_url) for _ in range(STREAMS)]
    threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
    try:
        with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
            lengths = [TOKENS, SHORT_TOKENS] * 3
            job_ids = [http.post("/v1/jobs", json=body(n)).json()["id"] for n in lengths]
            for thread in threads:
                thread.start()
            for stream in streams:
                assert stream.started.wait(60), "a stream never started"
            job_ids += [stream.job_id for stream in streams]
            eventually(
                lambda: all(logged_tokens(client, j) > 3 for j in job_ids[:4]),
                60,
                "jobs to stream",
            )
            time.sleep(1.5)  # past the AOF's last fsync of these jobs' admission and START
            redis_server.stop(graceful=stop_signal == signal.SIGTERM)
            time.sleep(OUTAGE_S)  # the outage itself, not a synchronisation
            redis_server.start()
            eventually(
                lambda: client.zcard(keys.leases()) == 0, 120, "every job to end and its lease"
            )
            for thread in threads:
                thread.join(timeout=60)
            statuses = check_every_job(http, client, job_ids)
            assert statuses == ["succeeded"] * len(job_ids)
            check_no_key_leaked(client)
            for stream in streams:  # open across the outage: far shorter than SSE_PING_S
                stored = client.get(keys.job_text(stream.job_id)) or ""
                assert (stream.ended, stream.text) == ("length", stored), stream.job_id
        assert all(worker.running() for worker in workers)
    finally:
        client.close()
