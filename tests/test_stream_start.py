"""A streaming request waits for its job's first token before its response starts
(`api.stream_start`); a client that leaves meanwhile has its job cancelled."""

from __future__ import annotations

import json
import socket
import time

import pytest
import redis

from tests.cluster import MODEL_NAME, ClusterFactory, synthetic_engine
from tokenrelay.shared import keys

_WAIT_S = 10.0


@pytest.mark.e2e
def test_a_client_that_leaves_before_the_first_token_has_its_job_cancelled(
    make_cluster: ClusterFactory,
) -> None:
    """The job starts, its first token is a minute away: the client closes its connection
    while the response waits for it (`first_output`), and the API asks the job's worker to
    stop it (its engine, asleep until that token, would end it then), well before the ping
    interval (15 s) after which the response would start anyway."""
    cluster = make_cluster(synthetic_engine() | {"TOKENRELAY_SYNTHETIC_FIRST_TOKEN_MS": "60000"})
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    body = json.dumps(
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    port = int(cluster.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=_WAIT_S) as connection:
        connection.sendall(head + body)
        job_id = _running_job(client)
    assert _field_within(client, job_id, "cancel_requested", "1")
    client.close()


def _running_job(client: redis.Redis) -> str:
    """The id of the one job, once it runs."""
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        for job_id in client.zrange(keys.leases(), 0, -1):
            if client.hget(keys.job(job_id), "status") == "running":
                return str(job_id)
        time.sleep(0.02)
    raise AssertionError(f"no job ran within {_WAIT_S}s")


def _field_within(client: redis.Redis, job_id: str, field: str, value: str) -> bool:
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        if client.hget(keys.job(job_id), field) == value:
            return True
        time.sleep(0.02)
    return False
