"""Fan-out of job events: one pub/sub connection per API process (per primary node of a
Redis Cluster token plane, with sharded pub/sub), shared by all its streams.

`StreamHub.events(job_id, after_seq)` yields a job's events in `seq` order and ends with its
terminal event. Each comes as a `Delivery`, parsed once per message however many streams read
it, beside its JSON as the log holds it, which a route may forward unchanged. It subscribes
first, then replays the log, then forwards live events, dropping duplicates by `seq`, so a
late or reconnecting reader misses nothing. When the pub/sub connection drops (Redis
restart) or stays quiet for a ping interval, each reader re-reads the log from its last
`seq`: published messages lost meanwhile are recovered.

A server that stops answering (a frozen primary) keeps the connection open: the hub pings
it when it has been quiet for `_PING_AFTER_S` while subscribed, and takes it for dead when
no reply comes within `_SILENCE_S`, or when a subscription is not confirmed in time; it then
reconnects (through the sentinels, to the primary they name) and subscribes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from tokenrelay.shared import keys
from tokenrelay.shared.events import Event, is_terminal, parse_event

log = logging.getLogger(__name__)

_SUBSCRIBE_TIMEOUT_S = 5.0
_RECONNECT_BACKOFF_S = 0.5
_PING_AFTER_S = 2.0
_SILENCE_S = 6.0
_PING_MESSAGE = "tokenrelay-hub"
# What a dropped pub/sub connection raises: under uvloop, a command written to a transport
# that Redis closed raises RuntimeError ("the handler is closed"), not a ConnectionError; a
# cluster whose slots are not all served raises RedisClusterException, not a RedisError.
_CONNECTION_ERRORS = (RedisError, RedisClusterException, OSError, RuntimeError)
_NODE_OPTIONS = ("username", "password", "decode_responses", "socket_connect_timeout")
"""What a cluster node's own pub/sub connection takes from the cluster client's options."""


class Heartbeat:
    """Yielded by `StreamHub.events` when nothing happened for `idle_s`: time for a ping."""


HEARTBEAT = Heartbeat()
_RESYNC = object()


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event of a job: parsed, and its JSON payload exactly as the log holds it."""

    event: Event
    raw: str


StreamItem = Delivery | Heartbeat


class _Listener:
    """One pub/sub connection and the task reading it: the hub's only one on a plain Redis,
    one per primary node on a Redis Cluster (sharded pub/sub: SSUBSCRIBE on the node that
    owns the channel's slot)."""

    def __init__(self, hub: StreamHub, pubsub: PubSub, *, sharded: bool) -> None:
        self.pubsub = pubsub
        self.connected = asyncio.Event()
        #: Set when a subscription went unconfirmed: the read loop then replaces the connection.
        self.unconfirmed = asyncio.Event()
        self._hub = hub
        self._sharded = sharded
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._read_loop(), name="stream-hub")

    async def subscribe(self, channel: str) -> None:
        if self._sharded:
            await self.pubsub.ssubscribe(channel)
        else:
            await self.pubsub.subscribe(channel)

    async def unsubscribe(self, channel: str) -> None:
        if self._sharded:
            await self.pubsub.sunsubscribe(channel)
        else:
            await self.pubsub.unsubscribe(channel)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.pubsub.aclose()

    async def _read_loop(self) -> None:
        """Read and dispatch; a server that stops answering (a ping sent after
        `_PING_AFTER_S` of silence goes unanswered for `_SILENCE_S`, or a subscription is not
        confirmed) is left for a new connection, as one that closes is."""
        loop = asyncio.get_running_loop()
        pubsub = self.pubsub
        while True:
            try:
                await pubsub.connect()
                self.unconfirmed.clear()
                self.connected.set()
                heard_at = pinged_at = loop.time()
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    now = loop.time()
                    if message is not None:
                        heard_at = now
                        self._hub.dispatch(message)
                    elif self.unconfirmed.is_set() or now - heard_at > _SILENCE_S:
                        raise redis.exceptions.ConnectionError("pub/sub server stopped answering")
                    elif pubsub.subscribed and now - max(heard_at, pinged_at) > _PING_AFTER_S:
                        await pubsub.ping(_PING_MESSAGE)
                        pinged_at = now
                    if not pubsub.subscribed:
                        heard_at = now  # nothing to hear: a subscription tells the rest
            except _CONNECTION_ERRORS as exc:
                log.warning("pub/sub connection lost, reconnecting: %s", exc)
                self.connected.clear()
                self._hub.resync()
                if pubsub.connection is not None:
                    with contextlib.suppress(*_CONNECTION_ERRORS):
                        await pubsub.connection.disconnect()
                await asyncio.sleep(_RECONNECT_BACKOFF_S)


class StreamHub:
    """The API process's readers of jobs' events, on the token plane's Redis `client`; a
    Redis Cluster client reads the logs from the node owning each job's slot and listens
    on one sharded pub/sub connection per primary node."""

    def __init__(self, client: redis.asyncio.Redis | RedisCluster) -> None:
        self._client = client
        self._listeners: dict[str, _Listener] = {}
        self._readers: dict[str, set[asyncio.Queue[Any]]] = {}
        self._confirmed: dict[str, asyncio.Event] = {}
        self._channel_listener: dict[str, _Listener] = {}
        self._started = False
        if not isinstance(client, RedisCluster):
            self._listeners[""] = _Listener(self, client.pubsub(), sharded=False)

    def start(self) -> None:
        self._started = True
        for listener in self._listeners.values():
            listener.start()

    async def close(self) -> None:
        for listener in self._listeners.values():
            await listener.close()

    @property
    def channel_count(self) -> int:
        return len(self._readers)

    async def events(
        self, job_id: str, *, after_seq: int = -1, idle_s: float = 15.0
    ) -> AsyncIterator[StreamItem]:
        """Events of `job_id` with `seq > after_seq`, through the terminal one."""
        last_seq = after_seq
        async with self._subscription(job_id) as queue:
            pending = await self._replay(job_id, last_seq)
            while True:
                for delivery in pending:
                    if delivery.event.seq <= last_seq:
                        continue
                    last_seq = delivery.event.seq
                    yield delivery
                    if is_terminal(delivery.event):
                        return
                if queue.empty():
                    try:
                        item = await asyncio.wait_for(queue.get(), timeout=idle_s)
                    except TimeoutError:
                        yield HEARTBEAT
                        pending = await self._replay(job_id, last_seq)
                        continue
                else:
                    item = queue.get_nowait()
                if item is _RESYNC:
                    pending = await self._replay(job_id, last_seq)
                elif item.event.seq <= last_seq:
                    pending = []  # already replayed from the log
                elif item.event.seq == last_seq + 1:
                    pending = [item]
                else:
                    pending = await self._replay(job_id, last_seq)  # a message was lost

    async def last_event(self, job_id: str) -> Delivery | None:
        """The newest event of the job's log, None while (or once) the log is empty."""
        entries: Any = await self._client.xrevrange(keys.job_events(job_id), count=1)
        return _delivery(entries[0][1]["e"]) if entries else None

    async def _replay(self, job_id: str, after_seq: int) -> list[Delivery]:
        log_key = keys.job_events(job_id)
        entries: Any = await self._client.xrange(log_key, min=f"1-{after_seq + 1}")
        return [_delivery(fields["e"]) for _, fields in entries]

    async def _listener(self, channel: str) -> _Listener:
        """The listener for `channel`: on a cluster, that of the primary owning its slot."""
        client = self._client
        if not isinstance(client, RedisCluster):
            return self._listeners[""]
        await client.initialize()  # learns the slots once; a no-op afterwards
        node = client.get_node_from_key(channel)
        if node is None:
            raise redis.exceptions.ConnectionError(f"no cluster node serves {channel!r}")
        listener = self._listeners.get(node.name)
        if listener is None:
            options: dict[str, Any] = {k: node.connection_kwargs.get(k) for k in _NODE_OPTIONS}
            node_client = redis.asyncio.Redis(host=node.host, port=int(node.port), **options)
            listener = _Listener(self, node_client.pubsub(), sharded=True)
            self._listeners[node.name] = listener
            if self._started:
                listener.start()
        return listener

    @contextlib.asynccontextmanager
    async def _subscription(self, job_id: str) -> AsyncIterator[asyncio.Queue[Any]]:
        channel = keys.job_channel(job_id)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        readers = self._readers.setdefault(channel, set())
        readers.add(queue)
        try:
            try:  # a failure here is Redis's (the request answers 503), never a 500
                if channel not in self._confirmed:
                    self._confirmed[channel] = asyncio.Event()
                    listener = self._channel_listener[channel] = await self._listener(channel)
                    # Subscribe on the connection the read loop listens to, never a second one.
                    await asyncio.wait_for(listener.connected.wait(), _SUBSCRIBE_TIMEOUT_S)
                    await listener.subscribe(channel)
                await self._confirmation(channel)
            except _CONNECTION_ERRORS as exc:  # TimeoutError is an OSError
                message = f"pub/sub subscription failed: {exc!r}"
                raise redis.exceptions.ConnectionError(message) from exc
            yield queue
        finally:
            readers.discard(queue)
            if not readers:
                del self._readers[channel]
                self._confirmed.pop(channel, None)
                with contextlib.suppress(*_CONNECTION_ERRORS, KeyError):
                    await self._channel_listener.pop(channel).unsubscribe(channel)

    async def _confirmation(self, channel: str) -> None:
        """Wait for the subscription's confirmation; a connection that gives none in time is
        replaced (its read loop reconnects and subscribes again), and waited for once more."""
        confirmed = self._confirmed[channel]
        try:
            await asyncio.wait_for(confirmed.wait(), _SUBSCRIBE_TIMEOUT_S)
        except TimeoutError:
            self._channel_listener[channel].unconfirmed.set()
            await asyncio.wait_for(confirmed.wait(), _SUBSCRIBE_TIMEOUT_S)

    def resync(self) -> None:
        """A pub/sub connection dropped: every reader re-reads its log from its last seq."""
        for readers in self._readers.values():
            for queue in readers:
                queue.put_nowait(_RESYNC)

    def dispatch(self, message: dict[str, Any]) -> None:
        if message["type"] == "pong":
            return
        channel = _text(message["channel"])
        if message["type"] in ("subscribe", "ssubscribe"):
            confirmed = self._confirmed.get(channel)
            if confirmed is not None:
                confirmed.set()
            return
        if message["type"] not in ("message", "smessage"):
            return
        delivery = _delivery(message["data"])
        for queue in self._readers.get(channel, ()):
            queue.put_nowait(delivery)


def _delivery(payload: bytes | str) -> Delivery:
    raw = _text(payload)
    return Delivery(parse_event(raw), raw)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
