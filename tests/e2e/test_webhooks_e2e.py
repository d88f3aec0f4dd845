"""Webhooks end to end: real API processes (two dispatchers sharing the queue) and workers
deliver signed job records to a local receiver."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tests.support.webhook_receiver import (
    SECRET,
    Receiver,
    assert_signed,
    wait_until_settled,
)

# --- end to end: real API and worker processes ------------------------------------------


@pytest.fixture(scope="module")
def hook_cluster(make_module_cluster: ClusterFactory) -> Cluster:
    settings = {
        "TOKENRELAY_WEBHOOK_SECRET": SECRET,
        "TOKENRELAY_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "TOKENRELAY_WEBHOOK_ALLOW_PRIVATE": "1",
        "TOKENRELAY_WEBHOOK_BACKOFF_S": "0.2",
        "TOKENRELAY_WEBHOOK_MAX_ATTEMPTS": "5",
    }
    return make_module_cluster(settings, api_workers=2)  # two dispatchers share the queue


def submit(cluster: Cluster, webhook: str, tokens: int, events: list[str] | None = None) -> str:
    body: dict[str, object] = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "tell me about the sea"}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "seed": 1,
        "webhook": webhook,
    }
    if events is not None:
        body["webhook_events_filter"] = events
    response = httpx.post(f"{cluster.base_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_e2e_start_then_completed_signed_with_the_final_record(
    hook_cluster: Cluster, receiver: Receiver
) -> None:
    job_id = submit(hook_cluster, f"http://127.0.0.1:{receiver.port}/both", tokens=64)
    first, second = receiver.next(), receiver.next()
    assert first.headers["webhook-id"] == f"msg_{job_id}_start"
    assert second.headers["webhook-id"] == f"msg_{job_id}_completed"
    for delivery in (first, second):
        assert delivery.path == "/both"
        assert_signed(delivery.headers, delivery.body)
    started = json.loads(first.body)
    assert started["id"] == job_id and started["started_at"] is not None
    final = httpx.get(f"{hook_cluster.base_url}/v1/jobs/{job_id}", timeout=30).json()
    assert json.loads(second.body) == final
    assert final["status"] == "succeeded" and final["usage"]["completion_tokens"] == 64
    wait_until_settled(hook_cluster)
    assert receiver.received.empty()


def test_e2e_a_receiver_that_fails_twice_gets_the_third_attempt_with_the_same_id(
    hook_cluster: Cluster, receiver: Receiver
) -> None:
    receiver.fail["/flaky"] = 2
    job_id = submit(hook_cluster, f"http://127.0.0.1:{receiver.port}/flaky", 4, ["completed"])
    attempts = [receiver.next() for _ in range(3)]
    assert {a.headers["webhook-id"] for a in attempts} == {f"msg_{job_id}_completed"}
    for attempt in attempts:
        assert_signed(attempt.headers, attempt.body)
        assert json.loads(attempt.body)["status"] == "succeeded"
    wait_until_settled(hook_cluster)
    assert receiver.received.empty()
    assert receiver.fail["/flaky"] == -1  # answered 500, 500, then 204 once


def test_e2e_a_completed_only_filter_sends_one_delivery(
    hook_cluster: Cluster, receiver: Receiver
) -> None:
    job_id = submit(hook_cluster, f"http://127.0.0.1:{receiver.port}/done", 8, ["completed"])
    only = receiver.next()
    assert only.headers["webhook-id"] == f"msg_{job_id}_completed"
    assert json.loads(only.body)["status"] == "succeeded"
    wait_until_settled(hook_cluster)
    assert receiver.received.empty()
