"""Reader channels through real processes: a chat stream on one API process, its job's event
stream read on another, while every event of the job goes on the first one's channel
(`keys.reader_channel`): its tokens from the worker's EMIT, its `started` and final events
from START and FINISH, so neither process subscribes to the job's own channel."""

from __future__ import annotations

import json
import threading

import httpx
import redis

from tests.support.cluster import ClusterFactory, stream_chat, synthetic_engine
from tokenrelay.shared.jobs import JobField
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

TOKENS = 40  # 2 s at 20 tok/s: the second reader joins while the job runs


def test_a_chat_job_streams_whole_on_its_api_process_and_on_another(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(synthetic_engine(20), api_workers=0)
    cluster.start_api()
    home = cluster.base_url
    cluster.start_api()
    other = cluster.base_url
    control = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    chat: list[tuple[str, str]] = []
    streaming = threading.Thread(
        target=lambda: chat.append(stream_chat(home, TOKENS, [{"role": "user", "content": "hi"}]))
    )
    streaming.start()
    try:
        eventually(lambda: control.lindex(keys.recent_jobs(), 0), 30, "the chat's job")
        job_id = control.lindex(keys.recent_jobs(), 0)
        assert job_id is not None
        reader = control.hget(keys.job(job_id), JobField.READER)
        assert reader is not None  # the home process named itself
        channel = keys.reader_channel(reader)
        overheard = control.pubsub()
        overheard.subscribe(channel)  # what the worker publishes there from now on
        events = []
        listeners = []
        with (
            httpx.Client(base_url=other, timeout=30) as http,
            http.stream("GET", f"/v1/jobs/{job_id}/events") as response,
        ):
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
                    if len(events) == 2:  # the other process listens on the home channel
                        listeners.append(control.pubsub_numsub(channel)[0][1])
                        # and neither process on the job's own: every event comes there
                        own = control.pubsub_numsub(keys.job_channel(job_id))[0][1]
                        listeners.append(own)
    finally:
        streaming.join(30)
    assert not streaming.is_alive()
    assert listeners == [3, 0]  # the home process, the other one, and this test; none
    messages = []
    while (message := overheard.get_message(timeout=1.0)) is not None:
        messages.append(message)
    overheard.close()
    carried = [m["data"].split("\n") for m in messages if m["type"] == "message"]
    assert carried and all(lines[0] == job_id for lines in carried)  # the tokens came here
    overheard_types = [json.loads(lines[-1])["type"] for lines in carried]
    assert overheard_types[-1] == "done"  # and the final event with them
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "started" and events[-1]["type"] == "done"
    tokens = [e for e in events if e["type"] == "token"]
    assert sum(e["tokens"] for e in tokens) == TOKENS
    assert chat == [(job_id, "".join(e["text"] for e in tokens))]
    control.close()
