"""The Batch API end to end through real API and worker processes, with the openai SDK
unchanged: upload, create, poll to `completed`, download and match every `custom_id`; bad
lines fail the batch with OpenAI's `errors`; cancel mid-run; expiry; another key's 404; a
batch's webhook: one signed delivery of the batch object when it ends, however it ends."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis
from openai.types import Batch

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tests.support.webhook_receiver import (
    SECRET,
    Received,
    Receiver,
    assert_signed,
    wait_until_settled,
)
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

pytestmark = pytest.mark.timeout(300)  # whole batches through a real cluster

KEY_A, KEY_B = "sk-batch-a", "sk-batch-b"
WAIT_S = 90
WEBHOOKS = {
    "TOKENRELAY_WEBHOOK_SECRET": SECRET,
    "TOKENRELAY_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    "TOKENRELAY_WEBHOOK_ALLOW_PRIVATE": "1",
    "TOKENRELAY_WEBHOOK_BACKOFF_S": "0.2",
}


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    settings = {"TOKENRELAY_API_KEYS": f"{KEY_A},{KEY_B}", "TOKENRELAY_MAX_INFLIGHT": "8"}
    return make_module_cluster(settings | WEBHOOKS)


def _client(cluster: Cluster, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[openai.OpenAI]:
    with _client(cluster, KEY_A) as c:
        yield c


def chat_line(custom_id: str, max_tokens: int = 4, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": f"say {custom_id}"}],
            "max_tokens": max_tokens,
            **body,
        },
    }


def upload(client: openai.OpenAI, lines: list[dict[str, Any]] | list[str]) -> str:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return client.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch").id


def wait_for(
    client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = WAIT_S
) -> Batch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.2)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_to_completed_with_every_custom_id_once(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    ids = [f"req-{i}" for i in range(12)]
    created = client.batches.create(
        input_file_id=upload(client, [chat_line(i) for i in ids]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"purpose": "test"},
    )
    assert created.status == "validating"
    assert created.metadata == {"purpose": "test"}
    done = wait_for(client, created.id, {"completed", "failed"})
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (12, 12)
    assert done.request_counts.failed == 0
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.error_file_id is None
    output = lines_of(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == ids  # once each, in input order
    for line in output:
        assert line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200
        body = response["body"]
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] <= 4
        assert line["id"].startswith("batch_req_")
    assert created.id in [b.id for b in client.batches.list()]
    output_file = client.files.retrieve(done.output_file_id or "")
    assert output_file.purpose == "batch_output"
    scrape = httpx.get(f"{cluster.base_url}/metrics", timeout=10).text
    [count] = [
        float(row.split()[-1])
        for row in scrape.splitlines()
        if row.startswith('tokenrelay_batch_lines_total{outcome="completed"}')
    ]
    assert count >= 12


def test_completions_endpoint(client: openai.OpenAI) -> None:
    line = {
        "custom_id": "c1",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": MODEL_NAME, "prompt": "Once", "max_tokens": 3},
    }
    batch = client.batches.create(
        input_file_id=upload(client, [line]), endpoint="/v1/completions", completion_window="24h"
    )
    done = wait_for(client, batch.id, {"completed", "failed"})
    assert done.status == "completed", done
    [out] = lines_of(client, done.output_file_id)
    assert out["response"]["body"]["object"] == "text_completion"


def test_bad_lines_fail_the_batch_with_openai_errors(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    lines = [
        json.dumps(chat_line("ok")),
        "{not json",
        json.dumps(chat_line("ok")),  # repeated custom_id
        json.dumps({**chat_line("m"), "method": "GET"}),
        json.dumps({**chat_line("u"), "url": "/v1/completions"}),
        json.dumps(chat_line("t", temperature=9)),
        json.dumps(chat_line("s", stream=True)),
        json.dumps(chat_line("x", model="no-such-model")),
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    failed = wait_for(client, batch.id, {"failed", "completed", "in_progress"})
    assert failed.status == "failed"
    assert failed.errors is not None and failed.errors.data
    by_line = {error.line: error for error in failed.errors.data}
    assert set(by_line) == {2, 3, 4, 5, 6, 7, 8}
    assert by_line[2].code == "invalid_json_line"
    assert by_line[3].code == "duplicate_custom_id"
    assert by_line[4].param == "method"
    assert by_line[5].code == "mismatched_endpoint"
    assert by_line[6].param == "body.temperature"
    assert by_line[7].param == "body.stream"
    assert by_line[8].code == "model_not_found"
    assert failed.failed_at and failed.output_file_id is None
    with redis.Redis.from_url(cluster.redis_url) as r:  # retired: kept as long as its files
        eventually(
            lambda: r.zscore(keys.active_batches(), batch.id) is None,
            10,
            "the failed batch to leave the active set",
        )
        assert 0 < r.ttl(keys.batch(batch.id)) <= 30 * 24 * 3600
        assert not r.exists(keys.batch_requests(batch.id))


def test_cancel_mid_run_ends_cancelled_with_consistent_counts(client: openai.OpenAI) -> None:
    lines = [chat_line(f"long-{i}", max_tokens=200, ignore_eos=True) for i in range(30)]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(client, batch.id, {"in_progress"})
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_for(client, batch.id, {"cancelled"})
    counts = done.request_counts
    assert counts is not None and counts.total == 30
    assert counts.completed + counts.failed == 30
    assert counts.failed > 0
    output = lines_of(client, done.output_file_id)
    errors = lines_of(client, done.error_file_id)
    assert len(output) == counts.completed and len(errors) == counts.failed
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"long-{i}" for i in range(30)
    )
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert done.cancelled_at and done.cancelling_at


def test_another_keys_batch_is_404(client: openai.OpenAI, cluster: Cluster) -> None:
    batch = client.batches.create(
        input_file_id=upload(client, [chat_line("mine")]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    with _client(cluster, KEY_B) as other:
        with pytest.raises(openai.NotFoundError):
            other.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            other.batches.cancel(batch.id)
        assert batch.id not in [b.id for b in other.batches.list()]
        with pytest.raises(openai.NotFoundError):  # nor can it run a batch on my file
            other.batches.create(
                input_file_id=batch.input_file_id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
    assert wait_for(client, batch.id, {"completed"}).status == "completed"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"endpoint": "/v1/embeddings", "completion_window": "24h"}, "endpoint"),
        ({"endpoint": "/v1/chat/completions", "completion_window": "1h"}, "completion_window"),
    ],
)
def test_bad_create_is_400_naming_the_field(
    client: openai.OpenAI, body: dict[str, str], param: str
) -> None:
    file_id = upload(client, [chat_line("a")])
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/batches", body={"input_file_id": file_id, **body}, cast_to=Batch)
    assert refused.value.body["param"] == param  # type: ignore[index]


def test_expiry_keeps_finished_lines_and_fails_the_rest_as_batch_expired(
    make_cluster: ClusterFactory, receiver: Receiver
) -> None:
    settings = {"TOKENRELAY_BATCH_COMPLETION_WINDOW_S": "4", "TOKENRELAY_MAX_INFLIGHT": "2"}
    cluster = make_cluster(settings | WEBHOOKS)
    with _client(cluster, "unused") as client:
        lines = [chat_line(f"e-{i}", max_tokens=300, ignore_eos=True) for i in range(20)]
        batch = client.batches.create(
            input_file_id=upload(client, lines),
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"webhook": hook_url(receiver, "/expired")},
        )
        done = wait_for(client, batch.id, {"expired", "completed"})
        assert one_delivery(cluster, receiver, batch.id, "/expired")["status"] == "expired"
        assert done.status == "expired"
        counts = done.request_counts
        assert counts is not None and counts.total == 20
        assert counts.completed + counts.failed == 20 and counts.failed > 0
        errors = lines_of(client, done.error_file_id)
        assert {line["error"]["code"] for line in errors} == {"batch_expired"}
        assert len(lines_of(client, done.output_file_id)) == counts.completed
        assert done.expired_at


# --- a batch's webhook ------------------------------------------------------------------


def hook_url(receiver: Receiver, path: str) -> str:
    return f"http://127.0.0.1:{receiver.port}{path}"


def one_delivery(cluster: Cluster, receiver: Receiver, batch_id: str, path: str) -> Any:
    """The one delivery a batch's end makes, checked: signed, `msg_<batch id>_completed`, the
    batch object as `GET /v1/batches/{id}` answers it; then none but it once all settle."""
    got: Received = receiver.next(WAIT_S)
    assert got.path == path
    assert got.headers["webhook-id"] == f"msg_{batch_id}_completed"
    assert_signed(got.headers, got.body)
    body = json.loads(got.body)
    wait_until_settled(cluster)
    assert receiver.received.empty()
    current = httpx.get(  # KEY_A is every batch's owner here; a cluster without keys ignores it
        f"{cluster.base_url}/v1/batches/{batch_id}",
        headers={"Authorization": f"Bearer {KEY_A}"},
        timeout=30,
    ).json()
    assert body == current
    return body


def test_a_batch_with_a_webhook_delivers_one_signed_completed_event(
    client: openai.OpenAI, cluster: Cluster, receiver: Receiver
) -> None:
    url = hook_url(receiver, "/done")
    created = client.batches.create(
        input_file_id=upload(client, [chat_line(f"w-{i}") for i in range(3)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"webhook": url},
    )
    assert (created.model_extra or {})["webhook"] == url
    body = one_delivery(cluster, receiver, created.id, "/done")
    assert body["object"] == "batch" and body["id"] == created.id
    assert body["status"] == "completed" and body["completed_at"]
    assert body["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert body["output_file_id"] and body["webhook"] == url
    assert Batch.model_validate(body).status == "completed"  # the openai SDK's batch shape


def test_a_cancelled_or_failed_batch_delivers_one_event_with_its_status(
    client: openai.OpenAI, cluster: Cluster, receiver: Receiver
) -> None:
    lines = [chat_line(f"wc-{i}", max_tokens=200, ignore_eos=True) for i in range(20)]
    running = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"webhook": hook_url(receiver, "/cancelled")},
    )
    wait_for(client, running.id, {"in_progress"})
    client.batches.cancel(running.id)
    cancelled = one_delivery(cluster, receiver, running.id, "/cancelled")
    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"]
    counts = cancelled["request_counts"]
    assert counts["total"] == 20 and counts["completed"] + counts["failed"] == 20
    invalid = client.batches.create(
        input_file_id=upload(client, [chat_line("ok"), "{not json"]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"webhook": hook_url(receiver, "/failed")},
    )
    failed = one_delivery(cluster, receiver, invalid.id, "/failed")
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["line"] == 2


@pytest.mark.parametrize(
    ("webhook", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data", "allow-list"),
        ("ftp://127.0.0.1/hook", "http or https"),
        ("http://user:pw@127.0.0.1/hook", "credentials"),
    ],
)
def test_a_bad_webhook_is_400_naming_it_and_no_batch_is_made(
    client: openai.OpenAI, webhook: str, reason: str
) -> None:
    file_id = upload(client, [chat_line("never")])
    before = [b.id for b in client.batches.list()]
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"webhook": webhook},
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"]) == ("invalid_request_error", "webhook")
    assert reason in error["message"]
    assert [b.id for b in client.batches.list()] == before
