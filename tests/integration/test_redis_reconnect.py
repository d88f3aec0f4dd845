"""Every client a process makes through `RedisConnector` survives a Redis restart: a pooled
connection left idle across it serves the next command (the pool replaces it), and the stream
hub's readers carry on once it is back. A client without retries (the API's) would otherwise
fail that command."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis

from tokenrelay.api.app import build_state
from tokenrelay.api.streaming.hub import Delivery
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.connect import RedisConnector
from tokenrelay.shared.settings import Settings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(persistent=True) as running:
        yield running


def test_a_sync_pool_replaces_a_connection_closed_by_a_restart(server: EmbeddedRedis) -> None:
    client = RedisConnector(Settings(redis_url=server.url)).sync_client(max_connections=2)
    try:
        client.set("k", "v")
        server.stop(graceful=True)
        server.start()
        # The pool's connections do not retry: only its check of the idle one makes this work.
        assert client.get("k") == b"v"
    finally:
        client.close()


async def test_async_client_and_stream_hub_carry_on_across_a_restart(
    server: EmbeddedRedis,
) -> None:
    state = build_state(Settings(redis_url=server.url))
    state.hub.start()
    sync = redis.Redis.from_url(server.url)
    job = "restarted-job"

    def emit(seq: int) -> None:
        event = {"seq": seq, "type": "token", "text": f"{seq} ", "tokens": 1}
        payload = json.dumps(event)
        sync.xadd(keys.job_events(job), {"e": payload}, id=f"1-{seq}")
        sync.publish(keys.job_channel(job), payload)

    received: list[int] = []
    first = asyncio.Event()

    async def read() -> None:
        async for item in state.hub.events(job, idle_s=30):
            assert isinstance(item, Delivery)
            received.append(item.event.seq)
            first.set()
            if item.event.seq == 3:
                return

    try:
        emit(0)
        reader = asyncio.create_task(read())
        await asyncio.wait_for(first.wait(), 10)
        assert await state.redis.get("absent") is None  # a pooled connection, now idle
        await asyncio.to_thread(server.stop, graceful=True)
        await asyncio.to_thread(server.start)
        emit(1)  # published before the hub is back: recovered from the log
        assert await state.redis.get("absent") is None
        emit(2)
        emit(3)
        await asyncio.wait_for(reader, 20)  # well inside the reader's idle time
        assert received == [0, 1, 2, 3]
    finally:
        sync.close()
        await state.close()
