"""Fan-out of job events to an API process's streams, with replay: one pub/sub connection per
API process (per primary node of a Redis Cluster token plane, with sharded pub/sub), shared
by all its streams.

`StreamHub.events(job_id, after_seq)` yields a job's events in `seq` order and ends with its
terminal event. A job read by the API process that admitted it (`reader`: that process's
`reader_id`) has its token events published on the reader's own channel, many jobs' in one
message (`shared/redis/lua/emit.lua`); where one Redis holds the token plane, so are its `started`
and final events (the job library, `shared/redis/lua/library.lua`), and the hub subscribes nothing
for such a job: it listens on its own reader channel always, and on another process's while
it reads a job of it. Elsewhere a job's other events come on its job's channel, subscribed
while the job is read.
Each event comes as a `Delivery`, parsed once however many streams read it, beside its JSON
as the log holds it, which a route may forward unchanged. It subscribes
first, then replays the log, then forwards live events, dropping duplicates by `seq`, so a
late or reconnecting reader misses nothing; a job it heard from before its admission
(`expect`) has nothing in its log to replay. When the pub/sub connection drops (Redis
restart), the hub connects again and, once its subscriptions are back, each reader re-reads
the log from its last `seq`: messages published meanwhile are recovered; so are they after
a reader heard nothing for its idle time. A job that has ended is read from its log alone.

The connections themselves, kept alive through Redis restarts and failovers, are
`api.streaming.listener`'s. HOT PATH: every token event an API process relays passes
`deliver` and `events` (docs/architecture.md, "The per-token path"); measure with
`python -m bench.gateway` before and after changing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from tokenrelay.api.streaming.listener import CONNECTION_ERRORS, SUBSCRIBE_TIMEOUT_S, Listener
from tokenrelay.shared.events import Event, is_terminal, parse_event
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.replies import as_text

_EXPECTED_S = 60.0
"""How long the hub hears a job it `expect`s before a reader takes it over; then it stops
(a reader that comes later replays the log, as any other)."""
_NODE_OPTIONS = ("username", "password", "decode_responses", "socket_connect_timeout")
"""What a cluster node's own pub/sub connection takes from the cluster client's options."""


class Heartbeat:
    """Yielded by `StreamHub.events` when nothing happened for `idle_s`: time for a ping."""


HEARTBEAT = Heartbeat()
_RESYNC = object()
_IDLE = object()
_CLOSING = object()


class StreamsClosing(Exception):
    """Raised by `StreamHub.events` once `close_streams` was called: this process stops."""


class _IdleAlarm:
    """Puts `_IDLE` in a reader's queue once it got nothing for `idle_s`. An item only moves
    the deadline (`heard`); the timer, armed once, re-arms itself for the moved deadline when
    it fires early: arming a timeout for every event (`asyncio.wait_for`, which also makes a
    task) cost the API 9 % of its samples at 512 relayed streams."""

    def __init__(self, queue: asyncio.Queue[Any], idle_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = queue
        self._idle_s = idle_s
        self._deadline = self._loop.time() + idle_s
        self._handle = self._loop.call_at(self._deadline, self._fire)

    def heard(self) -> None:
        self._deadline = self._loop.time() + self._idle_s

    def cancel(self) -> None:
        self._handle.cancel()

    def _fire(self) -> None:
        if self._loop.time() >= self._deadline:
            self._queue.put_nowait(_IDLE)
            self.heard()
        self._handle = self._loop.call_at(self._deadline, self._fire)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event of a job: parsed, and its JSON payload exactly as the log holds it."""

    event: Event
    raw: str


StreamItem = Delivery | Heartbeat


class StreamHub:
    """The API process's readers of jobs' events, on the token plane's Redis `client`; a
    Redis Cluster client reads the logs from the node owning each job's slot and listens
    on one sharded pub/sub connection per primary node."""

    def __init__(
        self, client: redis.asyncio.Redis | RedisCluster, *, plane_shared: bool = False
    ) -> None:
        self._client = client
        #: Whether the job library publishes on this Redis (one Redis for both planes): a job
        #: with a reader then has every event on its reader's channel.
        self._plane_shared = plane_shared
        self._listeners: dict[str, Listener] = {}
        self._readers: dict[str, set[asyncio.Queue[Any]]] = {}
        self._closing = False
        #: The job channels read through their reader's channel alone: that channel.
        self._via_reader: dict[str, str] = {}
        #: Jobs heard since before their admission (`expect`): each one's queue, and until
        #: when it is kept for a reader to take over (loop time), oldest first.
        self._expected: dict[str, tuple[asyncio.Queue[Any], float]] = {}
        self._confirmed: dict[str, asyncio.Event] = {}
        self._channel_listener: dict[str, Listener] = {}
        #: Reader channels listened on, and how many readers use each.
        self._reader_refs: dict[str, int] = {}
        self._started = False
        #: The id jobs read here name as their reader; None on a Redis Cluster token plane,
        #: where each job's events go on its own shard channel.
        self.reader_id: str | None = None
        if not isinstance(client, RedisCluster):
            listener = self._listeners[""] = Listener(self, client.connection_pool, sharded=False)
            self.reader_id = uuid.uuid4().hex
            own = keys.reader_channel(self.reader_id)
            self._reader_refs[own] = 1  # listened on for the hub's life
            self._confirmed[own] = asyncio.Event()
            self._channel_listener[own] = listener
            listener.channels.add(own)

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

    def expect(self, job_id: str) -> None:
        """Hear `job_id`'s events from now on, before this process admits it to read it here
        (its reader is this process), where the job library publishes every event of such a
        job on this process's channel and that channel's subscription is in place: a reader
        that takes the job over (`events`, within `_EXPECTED_S`) has then heard every event
        and replays nothing from the log."""
        if not self._plane_shared or self.reader_id is None:
            return
        own = keys.reader_channel(self.reader_id)
        if not self._confirmed[own].is_set():
            return
        now = asyncio.get_running_loop().time()
        while self._expected:
            oldest, (_, until) = next(iter(self._expected.items()))
            if until > now:
                break
            self.forget(oldest)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._add_reader(keys.job_channel(job_id), queue, own)
        self._expected[job_id] = (queue, now + _EXPECTED_S)

    def forget(self, job_id: str) -> None:
        """Stop hearing a job `expect`ed that no reader took over (its admission failed)."""
        expected = self._expected.pop(job_id, None)
        if expected is None:
            return
        self._drop_reader(keys.job_channel(job_id), expected[0])

    def _add_reader(self, channel: str, queue: asyncio.Queue[Any], via: str | None) -> None:
        """Add a reader's `queue` of job channel `channel`, heard through reader channel
        `via` alone, or (None) on the job channel too."""
        self._readers.setdefault(channel, set()).add(queue)
        if via is not None:
            self._via_reader[channel] = via

    def _drop_reader(self, channel: str, queue: asyncio.Queue[Any]) -> bool:
        """Remove a reader's `queue` of job channel `channel`; True if it was the last."""
        readers = self._readers.get(channel, set())
        readers.discard(queue)
        if readers:
            return False
        self._readers.pop(channel, None)
        self._via_reader.pop(channel, None)
        return True

    async def events(
        self,
        job_id: str,
        *,
        reader: str | None = None,
        after_seq: int = -1,
        idle_s: float = 15.0,
        ended: bool = False,
    ) -> AsyncIterator[StreamItem]:
        """Events of `job_id`, whose reader is `reader` (the job hash's `reader`, None when it
        has none), with `seq > after_seq`, through the terminal one. A job known to have
        `ended` is read from its log without a subscription, unless the log still lacks its
        final event (on a token plane of its own, it comes from the outbox)."""
        last_seq = after_seq
        if ended:
            logged = await self._replay(job_id, last_seq)
            if logged and is_terminal(logged[-1].event):
                for delivery in logged:
                    yield delivery
                return
        async with self._subscription(job_id, reader) as (queue, heard_all):
            alarm = _IdleAlarm(queue, idle_s)
            try:
                pending = [] if heard_all else await self._replay(job_id, last_seq)
                while True:
                    for delivery in pending:
                        if delivery.event.seq <= last_seq:
                            continue
                        last_seq = delivery.event.seq
                        yield delivery
                        if is_terminal(delivery.event):
                            return
                    if self._closing:
                        raise StreamsClosing
                    item = await queue.get()
                    if item is _CLOSING:
                        raise StreamsClosing
                    if item is _IDLE:
                        yield HEARTBEAT
                        pending = await self._replay(job_id, last_seq)
                        continue
                    alarm.heard()
                    pending = await self._next(job_id, item, last_seq)
            finally:
                alarm.cancel()

    async def _next(self, job_id: str, item: Any, last_seq: int) -> list[Delivery]:
        """What a reader at `last_seq` forwards next, given what its queue held."""
        if item is _RESYNC:
            return await self._replay(job_id, last_seq)
        if item.event.seq <= last_seq:
            return []  # already replayed from the log
        if item.event.seq == last_seq + 1:
            return [item]
        return await self._replay(job_id, last_seq)  # a message was lost

    async def last_event(self, job_id: str) -> Delivery | None:
        """The newest event of the job's log, None while (or once) the log is empty."""
        entries: Any = await self._client.xrevrange(keys.job_events(job_id), count=1)
        return _delivery(entries[0][1]["e"]) if entries else None

    async def _replay(self, job_id: str, after_seq: int) -> list[Delivery]:
        log_key = keys.job_events(job_id)
        entries: Any = await self._client.xrange(log_key, min=f"1-{after_seq + 1}")
        return [_delivery(fields["e"]) for _, fields in entries]

    async def _listener(self, channel: str) -> Listener:
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
            listener = Listener(self, node_client.connection_pool, sharded=True)
            self._listeners[node.name] = listener
            if self._started:
                listener.start()
        return listener

    @contextlib.asynccontextmanager
    async def _subscription(
        self, job_id: str, reader: str | None
    ) -> AsyncIterator[tuple[asyncio.Queue[Any], bool]]:
        """A reader's queue of `job_id`'s messages: from its reader's channel, where the job
        has a reader on a plain Redis; from its job channel too unless the job library
        publishes every event of the job there (`plane_shared`). With it, whether the queue
        has heard the job since before its admission (`expect`)."""
        channel = keys.job_channel(job_id)
        reader_channel = None
        if reader is not None and self.reader_id is not None:
            reader_channel = keys.reader_channel(reader)
        per_job = reader_channel is None or not self._plane_shared
        expected = None
        if reader == self.reader_id and not per_job:
            expected = self._expected.pop(job_id, None)
        queue: asyncio.Queue[Any] = asyncio.Queue() if expected is None else expected[0]
        self._add_reader(channel, queue, None if per_job else reader_channel)
        if reader_channel is not None:
            self._reader_refs[reader_channel] = self._reader_refs.get(reader_channel, 0) + 1
        try:
            try:  # a failure here is Redis's (the request answers 503), never a 500
                if per_job:
                    await self._listen(channel)
                if reader_channel is not None:
                    await self._listen(reader_channel)
            except CONNECTION_ERRORS as exc:  # TimeoutError is an OSError
                message = f"pub/sub subscription failed: {exc!r}"
                raise redis.exceptions.ConnectionError(message) from exc
            yield queue, expected is not None
        finally:
            if self._drop_reader(channel, queue) and per_job:
                await self._unlisten(channel)
            if reader_channel is not None:
                self._reader_refs[reader_channel] -= 1
                if not self._reader_refs[reader_channel]:
                    del self._reader_refs[reader_channel]
                    await self._unlisten(reader_channel)

    async def _listen(self, channel: str) -> None:
        """Subscribe `channel` unless it is already, then wait for its confirmation."""
        if channel not in self._confirmed:
            self._confirmed[channel] = asyncio.Event()
            listener = self._channel_listener[channel] = await self._listener(channel)
            await listener.subscribe(channel)
        await self._confirmation(channel)

    async def _unlisten(self, channel: str) -> None:
        self._confirmed.pop(channel, None)
        with contextlib.suppress(*CONNECTION_ERRORS, KeyError):
            await self._channel_listener.pop(channel).unsubscribe(channel)

    async def _confirmation(self, channel: str) -> None:
        """Wait for the subscription's confirmation; a connection that gives none in time is
        replaced (its read loop reconnects and subscribes again), and waited for once more."""
        confirmed = self._confirmed[channel]
        try:
            await asyncio.wait_for(confirmed.wait(), SUBSCRIBE_TIMEOUT_S)
        except TimeoutError:
            self._channel_listener[channel].unconfirmed.set()
            await asyncio.wait_for(confirmed.wait(), SUBSCRIBE_TIMEOUT_S)

    def close_streams(self) -> None:
        """End every stream reading a job here (`events` raises `StreamsClosing`): the
        process stops, and its drain period is running out."""
        self._closing = True
        for queues in self._readers.values():
            for queue in queues:
                queue.put_nowait(_CLOSING)

    def resync(self, channels: set[str]) -> None:
        """A listener's new connection subscribed `channels`: each of their readers re-reads
        its log from its last seq, for what was published while none was subscribed."""
        for channel, queues in self._readers.items():
            if channel in channels or self._via_reader.get(channel) in channels:
                for queue in queues:
                    queue.put_nowait(_RESYNC)

    def confirm(self, channel: str) -> None:
        confirmed = self._confirmed.get(channel)
        if confirmed is not None:
            confirmed.set()

    def deliver(self, channel: str, payload: bytes | str) -> None:
        """A message of `channel`: one event of a job channel's job, or a reader channel's
        events, each as two lines: its job id, then the event."""
        if channel not in self._reader_refs:
            self._deliver(self._readers.get(channel), payload)
            return
        lines = iter(as_text(payload).split("\n"))
        for job_id, event in zip(lines, lines, strict=False):  # an odd line out is dropped
            self._deliver(self._readers.get(keys.job_channel(job_id)), event)

    @staticmethod
    def _deliver(readers: set[asyncio.Queue[Any]] | None, payload: bytes | str) -> None:
        if readers:
            delivery = _delivery(payload)
            for queue in readers:
                queue.put_nowait(delivery)


def _delivery(payload: bytes | str) -> Delivery:
    raw = as_text(payload)
    return Delivery(parse_event(raw), raw)
