"""A running job whose worker dies, or stops answering, continues on another worker from the
tokens already delivered: real API and worker processes, a Redis with AOF on."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from rq.worker import Worker

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.cli.harness import Child
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

pytestmark = pytest.mark.timeout(300)  # two workers, a reference run and a continued one

LEASE_TTL_S = 2
TOKENS = 200
GREEDY = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "tell me a long story"}],
    "max_tokens": TOKENS,
    "min_tokens": TOKENS,
    "temperature": 0,
}


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:  # type: ignore[override]
    with EmbeddedRedis(persistent=True) as server:
        yield server


@pytest.fixture
def cluster(redis_server: EmbeddedRedis, make_cluster: ClusterFactory) -> Cluster:
    settings = {
        "TOKENRELAY_LEASE_TTL_S": str(LEASE_TTL_S),
        "TOKENRELAY_WORKER_CONCURRENCY": "1",
        "TOKENRELAY_FLUSH_INTERVAL_MS": "0",
    }
    return make_cluster(settings, redis_url=redis_server.url, workers=0, api_workers=0)


def stream_job(http: httpx.Client, job_id: str, after: int | None = None) -> Iterator[dict]:
    """The job's events as `GET /v1/jobs/{id}/events` sends them, from seq `after` + 1."""
    headers = {} if after is None else {"Last-Event-ID": str(after)}
    with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                yield json.loads(line[6:])


def tokens_delivered(http: httpx.Client, job_id: str, count: int) -> list[dict]:
    """The job's events up to its first `count` delivered tokens (at least)."""
    events, seen = [], 0
    for event in stream_job(http, job_id):
        events.append(event)
        seen += event.get("tokens", 0)
        if seen >= count:
            return events
    raise AssertionError(f"the job ended before {count} tokens: {events[-1]}")


def check_one_stream(
    events: list[dict[str, Any]], record: dict[str, Any], tokens: int = TOKENS
) -> None:
    """The events a client read across the seam: every seq once, in order, one terminal
    event (`done`), no error, and the text the job record stores."""
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events].count("done") == 1
    assert events[-1]["type"] == "done"
    assert not [event for event in events if event["type"] == "error"]
    text = "".join(event.get("text", "") for event in events)
    assert text == record["text"]
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == tokens == sum(e.get("tokens", 0) for e in events)
    assert usage["prompt_tokens"] == events[0]["prompt_tokens"]


def lease_count(cluster: Cluster) -> int:
    with redis.Redis.from_url(cluster.redis_url) as client:
        return int(client.zcard(keys.leases()))


def migrations(cluster: Cluster) -> int:
    with redis.Redis.from_url(cluster.redis_url) as client:
        return int(client.get(keys.migrations()) or 0)


def runner_of(cluster: Cluster, http: httpx.Client, workers: list[Child], job_id: str) -> Child:
    """The worker process running the job now."""
    name = http.get(f"/v1/jobs/{job_id}").json()["workers"][-1]
    with redis.Redis.from_url(cluster.redis_url) as client:
        pid = int(client.hget(Worker.redis_worker_namespace_prefix + name, "pid") or 0)
    return next(worker for worker in workers if worker.pid == pid)


def kill(cluster: Cluster, worker: Child) -> None:
    worker.kill()
    cluster.group.remove(worker)


def run_uninterrupted(http: httpx.Client) -> dict[str, Any]:
    job_id = http.post("/v1/jobs", json=GREEDY).json()["id"]
    assert list(stream_job(http, job_id))[-1]["type"] == "done"
    return dict(http.get(f"/v1/jobs/{job_id}").json())


def test_a_killed_workers_greedy_job_continues_elsewhere_with_the_uninterrupted_text(
    cluster: Cluster,
) -> None:
    workers = [cluster.start_worker(), cluster.start_worker()]
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        reference = run_uninterrupted(http)
        assert reference["attempts"] == 1 and len(reference["workers"]) == 1
        job_id = http.post("/v1/jobs", json=GREEDY).json()["id"]
        head = tokens_delivered(http, job_id, 10)
        dead = runner_of(cluster, http, workers, job_id)
        kill(cluster, dead)
        events = list(stream_job(http, job_id, after=head[-1]["seq"]))
        record = http.get(f"/v1/jobs/{job_id}").json()
    check_one_stream(head + events, record)
    assert record["status"] == "succeeded"
    assert record["text"] == reference["text"]
    for count in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert record["usage"][count] == reference["usage"][count]
    assert record["attempts"] == 2
    assert len(set(record["workers"])) == 2
    continued = [event for event in events if event["type"] == "started"]
    assert [event.get("attempt") for event in continued] == [2]
    assert migrations(cluster) == 1
    eventually(lambda: lease_count(cluster) == 0, 10, "the leases to be released")


def test_a_killed_workers_json_job_continues_elsewhere_and_still_validates(
    cluster: Cluster,
) -> None:
    """Its grammar carries over: the next worker starts the schema's matcher past the
    delivered tokens (`Engine.continue_grammar`), so the text is the uninterrupted one."""
    story = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 300, "maxLength": 400}},
        "required": ["story"],
        "additionalProperties": False,
    }
    schema = {"name": "story", "schema": story, "strict": True}
    body = {key: value for key, value in GREEDY.items() if key != "min_tokens"}
    body |= {"max_tokens": 1500, "response_format": {"type": "json_schema", "json_schema": schema}}
    workers = [cluster.start_worker(), cluster.start_worker()]
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        reference_id = http.post("/v1/jobs", json=body).json()["id"]
        assert list(stream_job(http, reference_id))[-1]["type"] == "done"
        reference = http.get(f"/v1/jobs/{reference_id}").json()
        job_id = http.post("/v1/jobs", json=body).json()["id"]
        head = tokens_delivered(http, job_id, 10)
        kill(cluster, runner_of(cluster, http, workers, job_id))
        events = list(stream_job(http, job_id, after=head[-1]["seq"]))
        record = http.get(f"/v1/jobs/{job_id}").json()
    check_one_stream(head + events, record, reference["usage"]["completion_tokens"])
    assert record["status"] == "succeeded" and record["attempts"] == 2
    assert record["text"] == reference["text"]
    assert 300 <= len(json.loads(record["text"])["story"]) <= 400


def test_a_paused_worker_that_comes_back_writes_nothing_into_its_continued_job(
    cluster: Cluster,
) -> None:
    workers = [cluster.start_worker(), cluster.start_worker()]
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        reference = run_uninterrupted(http)
        job_id = http.post("/v1/jobs", json=GREEDY).json()["id"]
        tokens_delivered(http, job_id, 10)
        paused = runner_of(cluster, http, workers, job_id)
        assert paused.log_path is not None
        log_path = paused.log_path
        paused.signal(signal.SIGSTOP)
        eventually(
            lambda: http.get(f"/v1/jobs/{job_id}").json()["attempts"] == 2,
            30,
            "another worker to continue the paused worker's job",
        )
        paused.signal(signal.SIGCONT)
        eventually(
            lambda: "continued elsewhere" in log_path.read_text(errors="replace"),
            30,
            "the resumed worker to give the job up",
        )
        events = list(stream_job(http, job_id))
        record = http.get(f"/v1/jobs/{job_id}").json()
    check_one_stream(events, record)
    assert record["status"] == "succeeded"
    assert record["text"] == reference["text"]
    assert record["attempts"] == 2
    assert paused.running()
    eventually(lambda: lease_count(cluster) == 0, 10, "the leases to be released")


def test_after_its_last_attempt_a_killed_workers_job_ends_worker_lost(
    cluster: Cluster,
) -> None:
    cluster.settings["TOKENRELAY_JOB_MAX_ATTEMPTS"] = "2"
    workers = [cluster.start_worker(), cluster.start_worker()]
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        job_id = http.post("/v1/jobs", json=GREEDY).json()["id"]
        for delivered in (10, 20):
            tokens_delivered(http, job_id, delivered)
            kill(cluster, runner_of(cluster, http, workers, job_id))
        events = list(stream_job(http, job_id))
        record = http.get(f"/v1/jobs/{job_id}").json()
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] == "error" and events[-1]["error_type"] == "worker_lost"
    assert record["status"] == "failed" and record["attempts"] == 2
    eventually(lambda: lease_count(cluster) == 0, 10, "the leases to be released")


def test_a_stopped_worker_hands_its_running_job_over_once_its_drain_period_runs_out(
    cluster: Cluster,
) -> None:
    # No drain period, and a reply long enough that no machine finishes it before the
    # signal lands: the job is handed over, never finished by the stopping worker.
    cluster.settings["TOKENRELAY_WORKER_DRAIN_S"] = "0"
    long_reply = 1800
    body = GREEDY | {"max_tokens": long_reply, "min_tokens": long_reply}
    workers = [cluster.start_worker(), cluster.start_worker()]
    cluster.start_api()
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        job_id = http.post("/v1/jobs", json=body).json()["id"]
        tokens_delivered(http, job_id, 10)
        stopped = runner_of(cluster, http, workers, job_id)
        stopped.signal(signal.SIGTERM)
        assert stopped.wait(30) == 0
        events = list(stream_job(http, job_id))
        record = http.get(f"/v1/jobs/{job_id}").json()
    check_one_stream(events, record, long_reply)
    assert record["status"] == "succeeded" and record["attempts"] == 2
    assert [event.get("attempt") for event in events if event["type"] == "started"] == [None, 2]
    assert migrations(cluster) == 1
    eventually(lambda: lease_count(cluster) == 0, 10, "the leases to be released")
