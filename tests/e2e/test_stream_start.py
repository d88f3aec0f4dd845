"""A streaming request waits for its job's first token before its response starts
(`api.streaming.first_output`); a client that leaves meanwhile has its job cancelled."""

from __future__ import annotations

import json
import socket

import redis

from tests.support.cluster import MODEL_NAME, ClusterFactory, synthetic_engine
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

_WAIT_S = 10.0
_FIRST_TOKEN_S = 8
"""The engine's delay before a job's first token: longer than the wait for the cancel
(`_CANCEL_WAIT_S`), so the response never starts, and short enough for the worker to end the
job soon after (its engine sees the cancel at that step)."""
_CANCEL_WAIT_S = 5.0


def test_a_client_that_leaves_before_the_first_token_has_its_job_cancelled(
    make_cluster: ClusterFactory,
) -> None:
    """The job starts, its first token seconds away, and no ping starts the response
    meanwhile: the client closes its connection while the response waits for that token
    (`first_output`), and the API asks the job's worker to stop the job (`cancel_requested`)
    before the token could have come."""
    first_token_ms = str(_FIRST_TOKEN_S * 1000)
    cluster = make_cluster(
        synthetic_engine()
        | {"TOKENRELAY_SYNTHETIC_FIRST_TOKEN_MS": first_token_ms, "TOKENRELAY_SSE_PING_S": "300"}
    )
    body = json.dumps(
        {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    with redis.Redis.from_url(cluster.redis_url, decode_responses=True) as client:
        with socket.create_connection(("127.0.0.1", cluster.api_port), timeout=_WAIT_S) as conn:
            conn.sendall(head + body)
            eventually(lambda: _running_job(client), _WAIT_S, "the job to run")
        job_id = _running_job(client)
        assert job_id is not None
        eventually(
            lambda: client.hget(keys.job(job_id), "cancel_requested") == "1",
            _CANCEL_WAIT_S,
            "the job's cancel to be requested",
        )


def _running_job(client: redis.Redis) -> str | None:
    """The id of a running job, if one runs."""
    for member in client.zrange(keys.leases(), 0, -1):
        job_id = str(member)
        if client.hget(keys.job(job_id), "status") == "running":
            return job_id
    return None
