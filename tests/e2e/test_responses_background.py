"""Background responses through real processes with the official `openai` client: poll with
`retrieve`, resume a stream with `retrieve(stream=True, starting_after=N)` while it runs and
after it ended (exactly the events after N), cancel, a streaming client that leaves (a
background run goes on, a foreground one is cancelled), and an unread response settled by the
API's own loop with its job's records kept as long as it. The workers run the synthetic
engine at 20 tokens/s, one event per token, so a response runs long enough to be caught in
the middle; it always runs to `max_output_tokens` (status `incomplete`)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import redis

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory, synthetic_engine
from tokenrelay.api.responses.store import ResponseField
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

RESULT_TTL_S = 120


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster(
        synthetic_engine(20)
        | {
            "TOKENRELAY_MAX_INFLIGHT": "8",
            "TOKENRELAY_FLUSH_INTERVAL_MS": "0",
            "TOKENRELAY_RESULT_TTL_S": str(RESULT_TTL_S),
        }
    )


def background(client: openai.OpenAI, tokens: int, **fields: Any) -> Any:
    return client.responses.create(
        model=MODEL_NAME, input="go", background=True, max_output_tokens=tokens, **fields
    )


def ended(client: openai.OpenAI, response_id: str) -> Any:
    found: list[Any] = []

    def done() -> bool:
        found[:] = [client.responses.retrieve(response_id)]
        return found[0].status not in ("queued", "in_progress")

    eventually(done, timeout_s=60, what=f"response {response_id} to end")
    return found[0]


def summary(event: Any) -> tuple[Any, ...]:
    """What a resumed event must repeat: its type, number, item and text (not the end's
    `completed_at`, stamped by whichever process rendered it)."""
    return (
        event.type,
        event.sequence_number,
        getattr(event, "item_id", None),
        getattr(event, "delta", None),
    )


def test_a_background_response_is_answered_at_once_and_polled_to_its_end(
    client: openai.OpenAI,
) -> None:
    response = background(client, 20)
    assert response.status == "queued"
    assert response.background is True
    assert response.output == []
    final = ended(client, response.id)
    assert final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.usage.output_tokens == 20
    assert len(final.output_text.split()) == 20


def test_a_stream_resumes_after_n_while_running_and_after_the_end(
    client: openai.OpenAI,
) -> None:
    response = background(client, 60)
    first = []
    for event in client.responses.retrieve(response.id, stream=True):
        first.append(event)
        if event.sequence_number == 6:
            break
    assert [e.sequence_number for e in first] == list(range(7))
    assert client.responses.retrieve(response.id).status == "in_progress"
    rest = list(client.responses.retrieve(response.id, stream=True, starting_after=6))
    assert [e.sequence_number for e in rest] == list(range(7, 7 + len(rest)))
    assert rest[-1].type == "response.incomplete"
    text = "".join(e.delta for e in first + rest if e.type == "response.output_text.delta")
    final = client.responses.retrieve(response.id)
    assert text == final.output_text
    assert final.usage.output_tokens == 60
    after_end = list(client.responses.retrieve(response.id, stream=True, starting_after=6))
    assert [summary(e) for e in after_end] == [summary(e) for e in rest]
    assert after_end[-1].response.output == rest[-1].response.output
    last = rest[-1].sequence_number
    assert list(client.responses.retrieve(response.id, stream=True, starting_after=last)) == []


def test_cancel_ends_a_running_background_response_cancelled(client: openai.OpenAI) -> None:
    response = background(client, 400)
    eventually(
        lambda: client.responses.retrieve(response.id).status == "in_progress",
        timeout_s=30,
        what="the response to start",
    )
    cancelled = client.responses.cancel(response.id)
    assert cancelled.status == "cancelled"
    assert 0 < len(cancelled.output_text.split()) < 400
    assert client.responses.retrieve(response.id).status == "cancelled"
    events = list(client.responses.retrieve(response.id, stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "cancelled"
    assert events[-1].response.status == "cancelled"
    foreground = client.responses.create(model=MODEL_NAME, input="x", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(foreground.id)


def test_a_background_stream_runs_on_when_its_client_leaves(client: openai.OpenAI) -> None:
    stream = background(client, 30, stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()
    response_id = seen[0].response.id
    final = ended(client, response_id)
    assert final.status == "incomplete"
    assert final.usage.output_tokens == 30


def test_a_foreground_stream_whose_client_leaves_is_cancelled(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL_NAME, input="go", stream=True, max_output_tokens=400
    )
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()
    final = ended(client, seen[0].response.id)
    assert final.status == "cancelled"
    assert final.error.code == "cancelled"


def test_an_unread_background_response_is_settled_and_keeps_its_job_records(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    response = background(client, 10)
    job_key = keys.job(response.id.removeprefix("resp_"))
    control = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    try:
        eventually(
            lambda: control.hexists(keys.response(response.id), ResponseField.FINAL),
            timeout_s=30,
            what="the API's loop to settle the response nobody reads",
        )
        assert control.zscore(keys.unsettled_responses(), response.id) is None
        assert control.ttl(job_key) > RESULT_TTL_S  # kept as long as the response
        assert control.ttl(keys.job_events(response.id.removeprefix("resp_"))) > RESULT_TTL_S
    finally:
        control.close()
    assert client.responses.retrieve(response.id).usage.output_tokens == 10
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
