"""An API process killed (SIGKILL) while background responses run, some streamed through it:
nothing is lost. Their jobs run on (a background job has no listener to lose), the streams
resume on another API process after the last event each client saw, with exactly the rest
of the events, and the responses nobody reads any more are settled by the survivor."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory, synthetic_engine
from tokenrelay.testing.polling import eventually

TOKENS = 80  # 4 s at 20 tok/s: the kill lands mid-stream


@pytest.fixture
def cluster(make_cluster: ClusterFactory) -> Cluster:
    settings = synthetic_engine(20) | {"TOKENRELAY_FLUSH_INTERVAL_MS": "0"}
    return make_cluster(settings, workers=1, api_workers=0)


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_a_killed_api_loses_no_background_response_and_its_streams_resume_elsewhere(
    cluster: Cluster,
) -> None:
    doomed_child = cluster.start_api()
    doomed = client_of(cluster.base_url)
    cluster.start_api()
    survivor = client_of(cluster.base_url)
    streams: list[tuple[str, list[Any]]] = []
    for _ in range(3):
        stream = doomed.responses.create(
            model=MODEL_NAME, input="go", background=True, stream=True, max_output_tokens=TOKENS
        )
        seen = []
        for event in stream:
            seen.append(event)
            if event.type == "response.output_text.delta":
                break
        streams.append((seen[0].response.id, seen))
    unread = doomed.responses.create(
        model=MODEL_NAME, input="go", background=True, max_output_tokens=TOKENS
    )
    doomed_child.kill()
    with pytest.raises(openai.APIConnectionError):
        doomed.responses.retrieve(unread.id)
    assert survivor.responses.retrieve(streams[0][0]).status == "in_progress"
    for response_id, seen in streams:
        last = seen[-1].sequence_number
        rest = list(survivor.responses.retrieve(response_id, stream=True, starting_after=last))
        numbers = [event.sequence_number for event in seen + rest]
        assert numbers == list(range(len(numbers)))
        assert rest[-1].type == "response.incomplete"
        deltas = [e.delta for e in seen + rest if e.type == "response.output_text.delta"]
        final = survivor.responses.retrieve(response_id)
        assert "".join(deltas) == final.output_text
        assert final.usage is not None and final.usage.output_tokens == TOKENS
    eventually(
        lambda: survivor.responses.retrieve(unread.id).status == "incomplete",
        timeout_s=60,
        what="the unread background response to end",
    )
    whole = survivor.responses.retrieve(unread.id)
    assert whole.usage is not None and whole.usage.output_tokens == TOKENS
    doomed.close()
    survivor.close()
