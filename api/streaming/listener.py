"""One pub/sub connection kept alive: the stream hub's only one on a plain Redis, one per
primary node of a Redis Cluster token plane (sharded pub/sub). HOT PATH: every token event an
API process relays is read here (docs/architecture.md, "The per-token path"); measure with
`python -m bench.gateway` before and after changing it.

A server that stops answering (a frozen primary) keeps the connection open: the listener
pings it when it has been quiet for `_PING_AFTER_S` while subscribed, and takes it for dead
when no reply comes within `_SILENCE_S`, or when a subscription is not confirmed in time; it
then reconnects (through the sentinels, to the primary they name) and subscribes again. So
it does when the sentinels name a new primary (`RedisConnector.follow_primary_async`): the
old one takes writes for seconds more, and the workers' events no longer reach it. What it
reads goes to its `Dispatch` (the hub): messages, subscription confirmations, and a resync
once a new connection's subscriptions are in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any, Protocol

import redis.asyncio
import redis.asyncio.sentinel
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import RedisClusterException, RedisError

from tokenrelay.api import background
from tokenrelay.shared.redis.replies import as_text

log = logging.getLogger(__name__)

SUBSCRIBE_TIMEOUT_S = 5.0
_RECONNECT_BACKOFF_S = 0.5
_PING_AFTER_S = 2.0
_SILENCE_S = 6.0
_PING_MESSAGE = "tokenrelay-hub"
_RESYNC_PING = "tokenrelay-hub-subscribed"
"""Pinged after a new connection's subscriptions: its reply says they are in place."""
# What a dropped pub/sub connection raises: under uvloop, a command written to a transport
# that Redis closed raises RuntimeError ("the handler is closed"), not a ConnectionError; a
# cluster whose slots are not all served raises RedisClusterException, not a RedisError.
CONNECTION_ERRORS = (RedisError, RedisClusterException, OSError, RuntimeError)


class Dispatch(Protocol):
    """Where a listener's reads go (`StreamHub`)."""

    def resync(self, channels: set[str]) -> None: ...

    def confirm(self, channel: str) -> None: ...

    def deliver(self, channel: str, payload: bytes | str) -> None: ...


class Listener:
    """One pub/sub connection and the task reading it: the hub's only one on a plain Redis,
    one per primary node on a Redis Cluster (sharded pub/sub: SSUBSCRIBE on the node that
    owns the channel's slot).

    The read loop is the only task that connects, reads or replaces the connection: it
    subscribes every channel of `channels` on each new one. A reader's (un)subscription is
    written on the connected one, never reconnects it: when that write fails, or no
    connection is up, the read loop's next connection subscribes the channel."""

    def __init__(self, hub: Dispatch, connection_pool: ConnectionPool, *, sharded: bool) -> None:
        #: The channels that have readers, subscribed on every connection.
        self.channels: set[str] = set()
        self.connected = asyncio.Event()
        #: Set when a subscription went unconfirmed: the read loop then replaces the connection.
        self.unconfirmed = asyncio.Event()
        self._hub = hub
        # Reads carry their own timeout, and a write never waits on a read: no socket
        # timeout, no health-check PING (its reply would be read as a message).
        kwargs = {**connection_pool.connection_kwargs, "socket_timeout": None}
        kwargs["health_check_interval"] = 0
        # RESP2: under RESP3 each message is a push reply, which redis-py's parser logs at
        # debug level, formatting the whole message first whether or not the level is on
        # (16 % of the API's samples at 512 relayed streams).
        kwargs["protocol"] = 2
        self._new_connection = functools.partial(connection_pool.connection_class, **kwargs)
        self._pool = connection_pool
        self._connection: AbstractConnection | None = None
        #: Whether a connection was lost: the next one's readers re-read their logs.
        self._lost = False
        self._heard_at = 0.0
        self._subscribe = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._read_loop(), name="stream-hub")

    async def subscribe(self, channel: str) -> None:
        self.channels.add(channel)
        await self._send(self._subscribe, channel)

    async def unsubscribe(self, channel: str) -> None:
        self.channels.discard(channel)
        await self._send(self._unsubscribe, channel)

    async def close(self) -> None:
        if self._task is not None:
            await background.stop([self._task])
        if self._connection is not None:
            await self._connection.disconnect()

    async def _send(self, *command: str) -> None:
        """`command` on the connected connection; one that fails it is left to the read
        loop, which replaces it."""
        connection = self._connection
        if connection is None or not self.connected.is_set():
            return
        try:
            await connection.send_command(*command, check_health=False)
        except CONNECTION_ERRORS as exc:
            log.warning("pub/sub write failed, reconnecting: %s", exc)
            self.unconfirmed.set()

    def _batches(self, channels: set[str]) -> list[list[str]]:
        """`channels` as the commands that subscribe them: all in one, or on a cluster one by
        one (the channels of one SSUBSCRIBE must share a slot)."""
        if self._subscribe == "SSUBSCRIBE":
            return [[channel] for channel in channels]
        return [list(channels)] if channels else []

    def _handle(self, response: Any) -> None:
        """One reply read off the connection: a message, a confirmation or a pong (outside
        subscribed mode, a PING's reply is its bare message)."""
        if isinstance(response, list):
            kind, subject = as_text(response[0]), response[1]
        else:
            kind, subject = "pong", response
        if kind == "pong":
            if as_text(subject) == _RESYNC_PING and self._lost:
                self._lost = False
                self._hub.resync(self.channels)
        elif kind in ("subscribe", "ssubscribe"):
            self._hub.confirm(as_text(subject))
        elif kind in ("message", "smessage"):
            self._hub.deliver(as_text(subject), response[2])

    async def _read_loop(self) -> None:
        """Connect, subscribe `channels`, then read and dispatch until the connection fails
        or its server stops answering, and connect again. Once a new connection's
        subscriptions are confirmed, every reader re-reads its log: what was published
        meanwhile is recovered."""
        while True:
            connection = self._new_connection()
            try:
                await asyncio.wait_for(connection.connect(), SUBSCRIBE_TIMEOUT_S)
                self._connection = connection
                self.unconfirmed.clear()
                self.connected.set()
                # Ping after the subscriptions: its reply says they are all in place.
                for channels in self._batches(self.channels):
                    await connection.send_command(self._subscribe, *channels, check_health=False)
                await connection.send_command("PING", _RESYNC_PING, check_health=False)
                await self._serve(connection)
            except CONNECTION_ERRORS as exc:
                log.warning("pub/sub connection lost, reconnecting: %s", exc)
                self.connected.clear()
                self._lost = True
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await connection.disconnect()
                await asyncio.sleep(_RECONNECT_BACKOFF_S)

    async def _serve(self, connection: AbstractConnection) -> None:
        """Read `connection` (each read without a timeout of its own: arming one per message
        cost the API more CPU than dispatching it) while a watch task checks that its server
        still answers; returns only by raising the failure of either."""
        self._heard_at = asyncio.get_running_loop().time()
        tasks = (
            asyncio.create_task(self._read(connection)),
            asyncio.create_task(self._watch(connection)),
        )
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()

    async def _read(self, connection: AbstractConnection) -> None:
        loop = asyncio.get_running_loop()
        while True:
            response = await connection.read_response(disconnect_on_error=False, push_request=True)
            self._heard_at = loop.time()
            self._handle(response)

    async def _watch(self, connection: AbstractConnection) -> None:
        """Each second: a connection quiet for `_PING_AFTER_S` while subscribed is pinged; one
        that stays silent for `_SILENCE_S`, whose subscription went unconfirmed, or whose
        server the sentinels no longer call the primary is given up (raises)."""
        loop = asyncio.get_running_loop()
        pinged_at = loop.time()
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            if self.unconfirmed.is_set() or now - self._heard_at > _SILENCE_S:
                raise redis.exceptions.ConnectionError("pub/sub server stopped answering")
            if self._primary_moved(connection):
                raise redis.exceptions.ConnectionError("the sentinels name another primary")
            if self.channels and now - max(self._heard_at, pinged_at) > _PING_AFTER_S:
                await connection.send_command("PING", _PING_MESSAGE, check_health=False)
                pinged_at = now
            if not self.channels:
                self._heard_at = now  # nothing to hear: a subscription tells the rest

    def _primary_moved(self, connection: AbstractConnection) -> bool:
        """Whether `connection` reaches a server the sentinels no longer call the primary."""
        pool = self._pool
        if not isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
            return False
        address = (getattr(connection, "host", None), getattr(connection, "port", None))
        return pool.master_address is not None and pool.master_address != address
