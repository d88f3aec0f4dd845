"""The clients of one process move to a promoted replica together.

After `SENTINEL FAILOVER` the old primary takes writes for seconds more, until the sentinels
turn it into a replica. redis-py's pools learn of the promotion only when each makes a new
connection, so a client whose idle connection still reached the old primary wrote there while
another client of the same process wrote to the new one: a worker dequeued a job from the new
primary and started it on the old one, where the start was lost, and the job expired. Real
servers: a primary, a replica and three sentinels.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.sentinel

from tokenrelay.api.jobs import control as job_control
from tokenrelay.shared.errors import RedisUnavailable
from tokenrelay.shared.redis.connect import PRIMARY_CHECK_S, Address, RedisConnector
from tokenrelay.shared.settings import Settings
from tokenrelay.testing.polling import eventually
from tokenrelay.testing.sentinel import SERVICE, EmbeddedSentinel
from tokenrelay.worker.failover_guard import PROMOTION_WINDOW_S, FailoverGuard


@pytest.fixture
def group() -> Iterator[EmbeddedSentinel]:
    with EmbeddedSentinel() as sentinel_group:
        yield sentinel_group


def _settings(group: EmbeddedSentinel) -> Settings:
    return Settings(
        redis_url=group.url, redis_sentinels=group.sentinels, redis_sentinel_master=SERVICE
    )


def _port(client: redis.Redis) -> int:
    """The port of the server this command reached."""
    return int(client.config_get("port")["port"])


async def _async_port(client: redis.asyncio.Redis) -> int:
    reply: Any = await client.config_get("port")
    return int(reply["port"])


def _failover(group: EmbeddedSentinel) -> int:
    """Promote the replica; returns its port once the sentinels name it to clients
    (`SENTINEL MASTERS`, what redis-py asks, follows `GET-MASTER-ADDR-BY-NAME` by ~50 ms)."""
    new = group.failover()
    sentinels = redis.sentinel.Sentinel(
        [("127.0.0.1", port) for port in group.sentinel_ports],
        sentinel_kwargs={"socket_timeout": 1},
    )
    eventually(lambda: sentinels.discover_master(SERVICE)[1] == new, 10, "the sentinels to name it")
    return new


def _still_primary(port: int) -> bool:
    """Whether the old primary still takes writes (else the check above proved nothing: its
    connections would have failed over by themselves)."""
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as client:
        return bool(client.execute_command("ROLE")[0] == b"master")


def test_a_process_s_clients_follow_the_new_primary_together(group: EmbeddedSentinel) -> None:
    connector = RedisConnector(_settings(group))
    dequeuing = connector.sync_client(max_connections=4)
    starting = connector.sync_client(max_connections=4, decode_responses=True)
    old = group.primary_port()
    try:
        assert _port(dequeuing) == _port(starting) == old  # one idle connection each
        new = _failover(group)
        held = dequeuing.connection_pool.get_connection()
        try:  # the next command needs a new connection, which asks the sentinels
            assert _port(dequeuing) == new
        finally:
            dequeuing.connection_pool.release(held)
        assert _port(starting) == new, "a client of the process still writes to the old primary"
        assert _still_primary(old)
    finally:
        dequeuing.close()
        starting.close()
        connector.close()


async def test_a_process_s_asyncio_clients_follow_the_new_primary_together(
    group: EmbeddedSentinel,
) -> None:
    connector = RedisConnector(_settings(group))
    requests = connector.async_client(max_connections=4, decode_responses=True)
    files = connector.async_client(max_connections=4)
    old = group.primary_port()
    try:
        assert await _async_port(requests) == await _async_port(files) == old
        new = _failover(group)
        held = await requests.connection_pool.get_connection()
        try:
            assert await _async_port(requests) == new
            assert await _async_port(files) == new, "a client still writes to the old primary"
        finally:
            await requests.connection_pool.release(held)
        assert await _async_port(requests) == new, "a released connection to the old primary"
        assert _still_primary(old)
    finally:
        await requests.aclose()
        await files.aclose()
        await connector.aclose()


def test_a_write_on_the_old_primary_does_not_hold_though_the_pools_moved_meanwhile(
    group: EmbeddedSentinel,
) -> None:
    """With `MIN_REPLICAS=1`, a write the old primary took after the promotion has no replica
    to acknowledge it (the promoted one left). The guard compares the server that took it
    with the one the sentinels name, not with where the process's pools now point: in CI the
    primary watch moved them between a FINISH on the old primary and the guard's check, the
    check asked "has the primary moved?" and heard no, and the finished job was reaped on the
    new primary as `worker_lost`. The write made again reaches the new primary and holds,
    though no replica acknowledges it yet (the old primary has not resynced)."""
    settings = _settings(group).model_copy(update={"redis_min_replicas": 1})
    connector = RedisConnector(settings)
    client = connector.sync_client(max_connections=4, decode_responses=True)
    asked: list[Address | None] = []

    def primary() -> Address | None:
        asked.append(connector.primary_address())
        return asked[-1]

    guard = FailoverGuard(settings, client, primary)
    old = group.primary_port()

    def write_then_move(one: redis.Redis) -> int:
        port = _port(one)
        one.incr("tokenrelay:test:write")
        connector.primary_moved()  # what the primary watch does, any time
        return port

    try:
        assert guard.apply(_port, bool) == (old, True)
        new = _failover(group)
        assert guard.apply(write_then_move, bool) == (old, False)
        asked.clear()
        assert guard.apply(_port, lambda _: False) == (new, True)  # wrote nothing to keep
        assert asked == [], "a reply that wrote nothing waited for a replica"
        started = time.monotonic()
        assert guard.apply(_port, bool) == (new, True)
        assert time.monotonic() - started >= PROMOTION_WINDOW_S
        assert _still_primary(old)
    finally:
        client.close()
        connector.close()


def test_a_worker_process_moves_within_a_check_of_the_promotion(group: EmbeddedSentinel) -> None:
    """Without `follow_primary` an idle connection reaches the old primary until the sentinels
    reconfigure it (10 to 12 s here): a worker's lease renewals went there and its running jobs were
    reaped on the new primary."""
    connector = RedisConnector(_settings(group))
    client = connector.sync_client(max_connections=4)
    stop = threading.Event()
    watch = threading.Thread(target=connector.follow_primary, args=(stop,), daemon=True)
    old = group.primary_port()
    try:
        assert _port(client) == old
        watch.start()
        new = _failover(group)
        eventually(lambda: _port(client) == new, 3 * PRIMARY_CHECK_S, "the client to move")
        assert _still_primary(old), "the old primary was reconfigured: nothing was shown"
    finally:
        stop.set()
        watch.join(timeout=5)
        client.close()
        connector.close()
    assert not watch.is_alive()


async def test_an_api_process_moves_within_a_check_of_the_promotion(
    group: EmbeddedSentinel,
) -> None:
    """The same for an API process: its asyncio clients and its sync ones (RQ's)."""
    connector = RedisConnector(_settings(group))
    requests = connector.async_client(max_connections=4)
    rq_connection = connector.sync_client(max_connections=4)
    old = group.primary_port()
    watch = asyncio.create_task(connector.follow_primary_async())
    try:
        assert await _async_port(requests) == _port(rq_connection) == old
        assert connector.primary_moves() == 0, "finding the first primary is no move"
        new = await asyncio.to_thread(_failover, group)
        deadline = time.monotonic() + 3 * PRIMARY_CHECK_S
        while await _async_port(requests) != new or _port(rq_connection) != new:
            assert time.monotonic() < deadline, "a client still reaches the old primary"
            await asyncio.sleep(0.1)
        assert connector.primary_moves() > 0
        assert _still_primary(old), "the old primary was reconfigured: nothing was shown"
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await requests.aclose()
        rq_connection.close()
        await connector.aclose()


async def test_an_admission_across_a_primary_move_is_refused_though_acknowledged(
    group: EmbeddedSentinel,
) -> None:
    """An admission's writes run on three clients (ADMIT, the webhook fields, RQ's enqueue)
    and its `WAIT` on a fourth. With two replicas, the new primary keeps one: a `WAIT` made
    there after a move is acknowledged though the first writes reached the old primary, and
    that accepted job would be lost. So an admission across a move is refused, whatever the
    `WAIT` said; one without a move is admitted once acknowledged."""
    settings = _settings(group).model_copy(update={"redis_min_replicas": 1})
    client = redis.asyncio.Redis.from_url(group.url)
    moves = [0]
    state = SimpleNamespace(
        settings=settings, redis=client, connector=SimpleNamespace(primary_moves=lambda: moves[0])
    )
    try:
        await job_control._wait_for_replicas(state, 0)  # type: ignore[arg-type]
        moves[0] = 1
        with pytest.raises(RedisUnavailable, match="primary changed during the admission"):
            await job_control._wait_for_replicas(state, 0)  # type: ignore[arg-type]
    finally:
        await client.aclose()


def test_a_sentinel_whose_port_was_taken_starts_again_on_another() -> None:
    """A port free when the group picked it can be taken before the sentinel binds it (by an
    outgoing connection's ephemeral port, say); the group then settled never (a CI failure)."""
    group = EmbeddedSentinel()
    taken = group.sentinel_ports[0]
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        with group:
            assert group.sentinel_ports[0] != taken
            assert group.primary_port() == group.servers[0].port
