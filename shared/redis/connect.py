"""The one way a tokenrelay process connects to Redis, for every client it has: the API's
pools (requests, scripts, pub/sub, webhook dispatcher, metrics), RQ's connection, the
worker's clients. A process makes them all through one `RedisConnector`.

`TOKENRELAY_REDIS_URL` names the server, its database and password. With
`TOKENRELAY_REDIS_SENTINELS` set, the server is whichever one the sentinels call the
primary of `TOKENRELAY_REDIS_SENTINEL_MASTER` (the URL's host and port are then unused, its
database and password still apply; `TOKENRELAY_REDIS_SENTINEL_PASSWORD` is the sentinels'
own): redis-py's Sentinel pools look the primary up on every new connection, and drop a
connection whose server answers as a replica (READONLY), so the next command reaches the new
primary after a failover.

`TOKENRELAY_STREAM_REDIS_URL`, when set, names the token plane's own Redis (job event logs,
channels, texts: `shared.redis.keys`), with `TOKENRELAY_STREAM_REDIS_CLUSTER` a Redis Cluster
reached through any of its nodes; `stream_sync_client` and `stream_async_client` connect to
it, and return None when the control Redis holds the token plane too.

A promoted replica and the old primary both take writes until the sentinels turn the old one
into a replica (seconds). redis-py's pools learn of the promotion one at a time, when each
makes a new connection: a worker whose RQ client had moved dequeued a job from the new
primary while its scripts client still started it on the old one, where the start was lost,
and the job expired in the new primary's records. The pools of one connector follow the
primary together: the first to learn of a new one moves them all (idle connections close at
once, busy ones when they are released), so one process never writes to two primaries.
They would still learn of it only when one of them makes a new connection, at the latest
when the sentinels turn the old primary into a replica (10 to 12 s after the promotion here):
meanwhile a worker's lease renewals went there, and the new primary reaped its jobs as lost.
`follow_primary` (a worker's thread) and `follow_primary_async` (an API's task) ask the
sentinels every `PRIMARY_CHECK_S`, so a process moves within that of the promotion.

`is_primary` reads `ROLE`: a replica answers PING and reads too, so readiness asks this.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.maint_notifications import MaintNotificationsConfig

from tokenrelay.shared.redis.replies import as_text
from tokenrelay.shared.settings import Settings

log = logging.getLogger(__name__)

SENTINEL_TIMEOUT_S = 2.0
PRIMARY_CHECK_S = 1.0
Address = tuple[str, int]

SyncStreamClient = redis.Redis | redis.cluster.RedisCluster
AsyncStreamClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster


def _checked(options: dict[str, Any]) -> dict[str, Any]:
    """`options` for a client whose pool checks each connection it hands out. redis-py 8
    skips that check (a connection the server closed, or one holding unread data, is then
    used as is) while maintenance notifications are on, and by default ("auto") they are on
    in its sync pools and `from_url`: every connection left idle across a Redis restart
    failed its first command. tokenrelay never uses them (a Redis Enterprise feature)."""
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False), **options}


def _url_auth(settings: Settings) -> dict[str, Any]:
    """The database, user name and password of `TOKENRELAY_REDIS_URL`."""
    parts = urlsplit(settings.redis_url)
    path = parts.path.strip("/")
    return {
        "db": int(path) if path else 0,
        "username": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
    }


def _sentinel_kwargs(settings: Settings) -> dict[str, Any]:
    password = settings.redis_sentinel_password
    return {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "password": password.get_secret_value() if password else None,
    }


class _PrimaryRecord:
    """The primary a process's sentinels last named, and how often they named a new one."""

    def __init__(self) -> None:
        self._primary: Address | None = None
        self.moves = 0
        """How often the primary changed from one it had found (the first find is no move)."""

    def found(self, address: Address) -> bool:
        """Record the primary the sentinels named; True if it is another than the last."""
        moved, before, self._primary = address != self._primary, self._primary, address
        if moved and before is not None:
            self.moves += 1
        return moved


class _SyncSentinel(redis.sentinel.Sentinel):
    """Sentinels whose primary pools move together when one of them finds a new primary."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pools: weakref.WeakSet[redis.sentinel.SentinelConnectionPool] = weakref.WeakSet()
        self.record = _PrimaryRecord()
        self._lock = threading.Lock()

    def follow(self, client: redis.Redis) -> None:
        """Move `client`'s pool with the others (`master_for` made it)."""
        assert isinstance(client.connection_pool, redis.sentinel.SentinelConnectionPool)
        self._pools.add(client.connection_pool)

    def discover_master(self, service_name: str) -> Address:
        address: Address = super().discover_master(service_name)
        with self._lock:
            moved = self.record.found(address)
        if moved:
            for pool in list(self._pools):
                pool.get_master_address()  # closes its idle connections to the old primary
        return address

    def primary_moved(self, service_name: str) -> bool:
        """Ask the sentinels now; True if they name another primary than they last did."""
        before = self.record.moves
        self.discover_master(service_name)
        return self.record.moves != before


class _AsyncSentinelPool(redis.asyncio.sentinel.SentinelConnectionPool):
    """redis-py's asyncio Sentinel pool, which also closes a released connection to a server
    that is no longer the primary (its sync pool does; this one would reuse it)."""

    async def release(self, connection: Any) -> None:
        if self.is_master and self.master_address != (connection.host, connection.port):
            await connection.disconnect()
        await super().release(connection)


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    """The asyncio counterpart of `_SyncSentinel`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pools: weakref.WeakSet[_AsyncSentinelPool] = weakref.WeakSet()
        self.record = _PrimaryRecord()

    def follow(self, client: redis.asyncio.Redis) -> None:
        """Move `client`'s pool with the others (`master_for` made it)."""
        assert isinstance(client.connection_pool, _AsyncSentinelPool)
        self._pools.add(client.connection_pool)

    async def discover_master(self, service_name: str) -> Address:
        address: Address = await super().discover_master(service_name)
        if self.record.found(address):
            for pool in list(self._pools):
                await pool.get_master_address()
        return address


class RedisConnector:
    """Makes the Redis clients of one process (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._sync_sentinel: _SyncSentinel | None = None
        self._async_sentinel: _AsyncSentinel | None = None
        if settings.redis_sentinels:
            self._sync_sentinel = _SyncSentinel(
                settings.redis_sentinels, sentinel_kwargs=_sentinel_kwargs(settings)
            )
            self._async_sentinel = _AsyncSentinel(
                settings.redis_sentinels, sentinel_kwargs=_sentinel_kwargs(settings)
            )

    def sync_client(self, *, max_connections: int | None = None, **options: Any) -> redis.Redis:
        """A client of the primary; `options` go to each connection (`decode_responses`, ...).
        With `max_connections`, its pool holds at most that many: without Sentinel a blocking
        pool (a thread waits up to `pool_wait_s` for a connection), with it redis-py's
        Sentinel pool."""
        settings = self._settings
        pool_wait_s = options.pop("pool_wait_s", None)
        if self._sync_sentinel is None:
            return _sync_client(settings.redis_url, max_connections, pool_wait_s, options)
        if max_connections is not None:
            options["max_connections"] = max_connections
        client: redis.Redis = self._sync_sentinel.master_for(
            settings.redis_sentinel_master,
            redis_class=redis.Redis,
            **_url_auth(settings),
            **_checked(options),
        )
        self._sync_sentinel.follow(client)
        return client

    def async_client(self, *, max_connections: int, **options: Any) -> redis.asyncio.Redis:
        """An asyncio client of the primary on a pool of at most `max_connections`; without
        Sentinel a blocking pool (a burst waits up to `pool_wait_s` for a connection instead
        of failing), with it a Sentinel pool."""
        settings = self._settings
        pool_wait_s = options.pop("pool_wait_s", None)
        if self._async_sentinel is None:
            return _async_client(settings.redis_url, max_connections, pool_wait_s, options)
        client: redis.asyncio.Redis = self._async_sentinel.master_for(
            settings.redis_sentinel_master,
            redis_class=redis.asyncio.Redis,
            connection_pool_class=_AsyncSentinelPool,
            max_connections=max_connections,
            **_url_auth(settings),
            **_checked(options),
        )
        self._async_sentinel.follow(client)
        return client

    def primary_moved(self) -> bool:
        """Whether the sentinels now name another primary than this process's sync clients
        reach (which then move to it); always False without Sentinel."""
        if self._sync_sentinel is None:
            return False
        return self._sync_sentinel.primary_moved(self._settings.redis_sentinel_master)

    def primary_moves(self) -> int:
        """How often this process's clients moved to a new primary (0 without Sentinel): a
        write and its `WAIT` made while this did not change reached one server."""
        if self._sync_sentinel is None or self._async_sentinel is None:
            return 0
        return self._sync_sentinel.record.moves + self._async_sentinel.record.moves

    def primary_address(self) -> Address | None:
        """The server the sentinels name as the primary now, moving this process's sync
        clients there if it is a new one; None without Sentinel."""
        if self._sync_sentinel is None:
            return None
        return self._sync_sentinel.discover_master(self._settings.redis_sentinel_master)

    def follow_primary(self, stop: threading.Event) -> None:
        """Until `stop` is set, ask the sentinels every `PRIMARY_CHECK_S` which server is the
        primary, moving this process's sync clients to a new one (returns at once without
        Sentinel)."""
        if self._sync_sentinel is None:
            return
        while not stop.wait(PRIMARY_CHECK_S):
            try:
                self.primary_moved()
            except redis.RedisError as exc:
                log.warning("could not ask the sentinels for the primary: %r", exc)

    async def follow_primary_async(self) -> None:
        """`follow_primary` for an asyncio process, for its asyncio and its sync clients;
        runs until cancelled."""
        if self._async_sentinel is None:
            return
        service = self._settings.redis_sentinel_master
        while True:
            await asyncio.sleep(PRIMARY_CHECK_S)
            try:
                await self._async_sentinel.discover_master(service)
                await asyncio.to_thread(self.primary_moved)
            except redis.RedisError as exc:
                log.warning("could not ask the sentinels for the primary: %r", exc)

    def close(self) -> None:
        """Close the connections to the sentinels (each client closes its own)."""
        if self._sync_sentinel is not None:
            for sentinel in self._sync_sentinel.sentinels:
                sentinel.close()

    async def aclose(self) -> None:
        """`close`, the asyncio clients' sentinel connections included."""
        self.close()
        if self._async_sentinel is not None:
            for sentinel in self._async_sentinel.sentinels:
                await sentinel.aclose()


def stream_sync_client(settings: Settings, **options: Any) -> SyncStreamClient | None:
    """A client of the token plane's own Redis (None: the control Redis is it); options as
    `sync_client`'s. A cluster client follows its slots (MOVED) itself."""
    if settings.token_plane_shared:
        return None
    if settings.stream_redis_cluster:
        options.pop("pool_wait_s", None)
        return redis.cluster.RedisCluster.from_url(settings.stream_redis_url, **_checked(options))
    max_connections = options.pop("max_connections", None)
    pool_wait_s = options.pop("pool_wait_s", None)
    return _sync_client(settings.stream_redis_url, max_connections, pool_wait_s, options)


def stream_async_client(
    settings: Settings, *, max_connections: int, **options: Any
) -> AsyncStreamClient | None:
    """An asyncio client of the token plane's own Redis (None: the control Redis is it), at
    most `max_connections` per node; options as `async_client`'s."""
    if settings.token_plane_shared:
        return None
    pool_wait_s = options.pop("pool_wait_s", None)
    if settings.stream_redis_cluster:
        return redis.asyncio.cluster.RedisCluster.from_url(
            settings.stream_redis_url, max_connections=max_connections, **_checked(options)
        )
    return _async_client(settings.stream_redis_url, max_connections, pool_wait_s, options)


def _sync_client(
    url: str, max_connections: int | None, pool_wait_s: float | None, options: dict[str, Any]
) -> redis.Redis:
    """A client of the Redis at `url`: with `max_connections`, on a blocking pool (a thread
    waits up to `pool_wait_s` for a connection)."""
    if max_connections is None:
        return redis.Redis.from_url(url, **_checked(options))
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_wait_s, **_checked(options)
    )
    return redis.Redis.from_pool(pool)


def _async_client(
    url: str, max_connections: int, pool_wait_s: float | None, options: dict[str, Any]
) -> redis.asyncio.Redis:
    """An asyncio client of the Redis at `url` on a blocking pool of `max_connections`."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_wait_s, **_checked(options)
    )
    return redis.asyncio.Redis.from_pool(pool)


def is_primary(role_reply: Any) -> bool:
    """Whether a `ROLE` reply comes from a primary (the only node that takes writes)."""
    role = role_reply[0]
    return as_text(role) == "master"
