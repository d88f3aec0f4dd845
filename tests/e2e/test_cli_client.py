"""The client commands (`tokenrelay chat`, `submit`, `status`, `cancel`, `top`, `batch`) as a
user runs them, against real `tokenrelay api` and `tokenrelay worker` processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import redis
from rq import Worker
from rq.serializers import JSONSerializer

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.cli.client.http import _sse_data
from tokenrelay.cli.embedded_redis import free_port
from tokenrelay.cli.harness import tokenrelay_command

LONG_JOB_TOKENS = 1800  # many seconds on the tiny model (2048 positions): holds the one slot
COMMAND_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster(
        {"TOKENRELAY_MAX_INFLIGHT": "2", "TOKENRELAY_WORKER_CONCURRENCY": "1"}
    )


def tokenrelay(cluster: Cluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `tokenrelay ARGS` with `TOKENRELAY_URL` pointing at the cluster."""
    environ = {k: v for k, v in os.environ.items() if k != "TOKENRELAY_API_KEY"}
    environ.update(TOKENRELAY_URL=cluster.base_url, **env)
    return subprocess.run(
        tokenrelay_command(*args),
        env=environ,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def assert_one_clear_error(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0]


def start_long_job(http: httpx.Client) -> str:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "go on"}],
        "max_tokens": LONG_JOB_TOKENS,
        "min_tokens": LONG_JOB_TOKENS,
    }
    response = http.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def end_jobs(http: httpx.Client, job_ids: list[str]) -> None:
    """Cancel the jobs and wait for their final events (their leases are then released)."""
    for job_id in job_ids:
        http.delete(f"/v1/jobs/{job_id}")
    for job_id in job_ids:
        with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
            for _ in response.iter_lines():
                pass  # the stream ends after the job's `done` or `error` event


def test_chat_streams_an_answer_to_stdout(cluster: Cluster) -> None:
    result = tokenrelay(cluster, "chat", "Write a poem about the sea", "--max-tokens", "16")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert result.stderr == ""


def test_submit_status_cancel_round_trip(cluster: Cluster, http: httpx.Client) -> None:
    blocker = start_long_job(http)  # the worker runs one job at a time: the next one waits
    try:
        submitted = tokenrelay(cluster, "submit", "hello", "--system", "Be brief.")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{32}", job_id)

        status = tokenrelay(cluster, "status", job_id)
        assert status.returncode == 0, status.stderr
        assert f"id: {job_id}" in status.stdout
        assert "status: queued" in status.stdout
        assert f"model: {MODEL_NAME}" in status.stdout

        cancelled = tokenrelay(cluster, "cancel", job_id, "--url", cluster.base_url)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"{job_id}: cancelled"
        after = tokenrelay(cluster, "status", job_id)
        assert "status: cancelled" in after.stdout
    finally:
        end_jobs(http, [blocker])


def test_cancel_of_a_running_job_waits_for_it_to_stop_and_says_cancelled(
    cluster: Cluster, http: httpx.Client
) -> None:
    job_id = start_long_job(http)
    try:
        with http.stream("GET", f"/v1/jobs/{job_id}/events") as events:
            data = (json.loads(line[6:]) for line in events.iter_lines() if line[:6] == "data: ")
            next(event for event in data if event["type"] == "token")
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
        cancelled = tokenrelay(cluster, "cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"{job_id}: cancelled"
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    finally:
        end_jobs(http, [job_id])


def test_chat_sends_the_sampling_flags(cluster: Cluster) -> None:
    question = ("chat", "Write a poem about the sea", "--max-tokens", "12")
    greedy = [tokenrelay(cluster, *question, "--temperature", "0") for _ in range(2)]
    seeded = [tokenrelay(cluster, *question, "--temperature", "1", "--seed", "7") for _ in range(2)]
    for first, second in (greedy, seeded):
        assert first.returncode == second.returncode == 0, first.stderr + second.stderr
        assert first.stdout == second.stdout != ""
    too_hot = tokenrelay(cluster, *question, "--temperature", "5")
    assert_one_clear_error(too_hot, "temperature", "HTTP 400")


def test_refusals_are_one_clear_stderr_line_and_a_failure_status(
    cluster: Cluster, http: httpx.Client
) -> None:
    unknown_model = tokenrelay(cluster, "chat", "hi", "--model", "nope")
    assert_one_clear_error(unknown_model, "model_not_found", "nope", "HTTP 404")
    too_long = tokenrelay(cluster, "chat", "hi", "--max-tokens", "100000")
    assert_one_clear_error(too_long, "invalid_request_error", "max_tokens", "HTTP 400")
    unknown_job = tokenrelay(cluster, "status", "0123456789abcdef")
    assert_one_clear_error(unknown_job, "job_not_found", "HTTP 404")
    nobody = f"http://127.0.0.1:{free_port()}"
    unreachable = tokenrelay(cluster, "chat", "hi", "--url", nobody)
    assert_one_clear_error(unreachable, f"cannot reach {nobody}")

    jobs = [start_long_job(http), start_long_job(http)]  # TOKENRELAY_MAX_INFLIGHT=2
    try:
        for command in ("chat", "submit"):
            overloaded = tokenrelay(cluster, command, "hi")
            assert_one_clear_error(overloaded, "cluster_overloaded", "HTTP 503")
            assert "Traceback" not in overloaded.stderr
    finally:
        end_jobs(http, jobs)


def test_top_once_shows_in_flight_queues_and_the_worker(cluster: Cluster) -> None:
    connection = redis.Redis.from_url(cluster.redis_url)
    try:
        [worker] = Worker.all(connection=connection, serializer=JSONSerializer)
    finally:
        connection.close()
    result = tokenrelay(cluster, "top", "--once", COLUMNS="200")
    assert result.returncode == 0, result.stderr
    assert "in flight 0/2" in result.stdout
    assert "workers: 1" in result.stdout
    assert worker.name in result.stdout
    assert "tokenrelay" in result.stdout  # the queue


def test_sse_data_joins_multi_line_events_and_skips_comments() -> None:
    lines = [": ping", "", "data: a", "data: b", "", "id: 3", "data:c", "", "data: [DONE]", ""]
    assert list(_sse_data(iter(lines))) == ["a\nb", "c", "[DONE]"]


def batch_line(custom_id: str, tokens: int) -> str:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "min_tokens": tokens,
    }
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line) + "\n"


def test_batch_submit_waits_to_completed_and_downloads_every_line(
    cluster: Cluster, tmp_path: Path
) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(batch_line(f"line-{i}", 4) for i in range(3)))
    submitted = tokenrelay(cluster, "batch", "submit", str(requests), "--wait", "--interval", "0.2")
    assert submitted.returncode == 0, submitted.stderr
    batch_id, *summary = submitted.stdout.splitlines()
    assert batch_id.startswith("batch_")
    assert "status: completed" in summary and "requests: 3 completed, 0 failed of 3" in summary
    status = tokenrelay(cluster, "batch", "status", batch_id)
    assert status.returncode == 0 and "status: completed" in status.stdout
    results = tmp_path / "results.jsonl"
    downloaded = tokenrelay(cluster, "batch", "download", batch_id, "--output", str(results))
    assert downloaded.returncode == 0, downloaded.stderr
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["line-0", "line-1", "line-2"]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    errors, again = tmp_path / "errors.jsonl", tmp_path / "again.jsonl"
    asked = ("batch", "download", batch_id, "--output", str(again), "--errors", str(errors))
    no_errors = tokenrelay(cluster, *asked)
    assert_one_clear_error(no_errors, f"batch {batch_id} has no error file", "0 of its 3")
    assert again.read_text() == results.read_text() and not errors.exists()


def test_batch_cancel_stops_a_running_batch_and_unknown_ids_are_one_error(
    cluster: Cluster, http: httpx.Client, tmp_path: Path
) -> None:
    requests = tmp_path / "long.jsonl"
    requests.write_text("".join(batch_line(f"long-{i}", LONG_JOB_TOKENS) for i in range(3)))
    submitted = tokenrelay(cluster, "batch", "submit", str(requests))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    cancelled = tokenrelay(cluster, "batch", "cancel", batch_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() in (f"{batch_id}: cancelling", f"{batch_id}: cancelled")
    watched = tokenrelay(cluster, "batch", "status", batch_id, "--watch", "--interval", "0.2")
    assert watched.returncode == 1  # ended, but not completed
    assert "status: cancelled" in watched.stdout
    unknown = tokenrelay(cluster, "batch", "status", "batch_0123456789abcdef")
    assert_one_clear_error(unknown, "batch_not_found", "HTTP 404")
    missing = tokenrelay(cluster, "batch", "submit", str(tmp_path / "missing.jsonl"))
    assert_one_clear_error(missing, "cannot read")
    # The webhook is sent with the batch: this cluster allows none, so the API refuses it.
    hooked = tokenrelay(cluster, "batch", "submit", str(requests), "--webhook", "https://h.test/x")
    assert_one_clear_error(hooked, "HTTP 400", "webhook")
