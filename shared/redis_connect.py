"""The one way a tokenrelay process connects to Redis, for every client it has: the API's
pool (requests, scripts, pub/sub, webhook dispatcher, metrics), RQ's connection, the
worker's clients.

`TOKENRELAY_REDIS_URL` names the server, its database and password. With
`TOKENRELAY_REDIS_SENTINELS` set, the server is whichever one the sentinels call the
primary of `TOKENRELAY_REDIS_SENTINEL_MASTER` (the URL's host and port are then unused, its
database and password still apply; `TOKENRELAY_REDIS_SENTINEL_PASSWORD` is the sentinels'
own): redis-py's Sentinel pools look the primary up on every new connection, and drop a
connection whose server answers as a replica (READONLY), so the next command reaches the new
primary after a failover.

`TOKENRELAY_STREAM_REDIS_URL`, when set, names the token plane's own Redis (job event logs,
channels, texts: `shared.keys`), with `TOKENRELAY_STREAM_REDIS_CLUSTER` a Redis Cluster
reached through any of its nodes; `stream_sync_client` and `stream_async_client` connect to
it, and return None when the control Redis holds the token plane too.

`is_primary` reads `ROLE`: a replica answers PING and reads too, so readiness asks this.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from tokenrelay.shared.settings import Settings

SENTINEL_TIMEOUT_S = 2.0

SyncStreamClient = redis.Redis | redis.cluster.RedisCluster
AsyncStreamClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster


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


def sync_client(
    settings: Settings, *, max_connections: int | None = None, **options: Any
) -> redis.Redis:
    """A client of the primary; `options` go to each connection (`decode_responses`, ...).
    With `max_connections`, its pool holds at most that many: without Sentinel a blocking
    pool (a thread waits up to `pool_wait_s` for a connection), with it redis-py's Sentinel
    pool."""
    pool_wait_s = options.pop("pool_wait_s", None)
    if not settings.redis_sentinels:
        if max_connections is None:
            return redis.Redis.from_url(settings.redis_url, **options)
        pool = redis.BlockingConnectionPool.from_url(
            settings.redis_url, max_connections=max_connections, timeout=pool_wait_s, **options
        )
        return redis.Redis.from_pool(pool)
    if max_connections is not None:
        options["max_connections"] = max_connections
    sentinel = redis.sentinel.Sentinel(
        settings.redis_sentinels, sentinel_kwargs=_sentinel_kwargs(settings)
    )
    return sentinel.master_for(
        settings.redis_sentinel_master, redis_class=redis.Redis, **_url_auth(settings), **options
    )


def async_client(
    settings: Settings, *, max_connections: int, **options: Any
) -> redis.asyncio.Redis:
    """An asyncio client of the primary on a pool of at most `max_connections`; without
    Sentinel a blocking pool (a burst waits up to `pool_wait_s` for a connection instead of
    failing), with it redis-py's Sentinel pool."""
    if not settings.redis_sentinels:
        pool_wait_s = options.pop("pool_wait_s", None)
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            settings.redis_url, max_connections=max_connections, timeout=pool_wait_s, **options
        )
        return redis.asyncio.Redis.from_pool(pool)
    options.pop("pool_wait_s", None)
    sentinel = redis.asyncio.sentinel.Sentinel(
        settings.redis_sentinels, sentinel_kwargs=_sentinel_kwargs(settings)
    )
    return sentinel.master_for(
        settings.redis_sentinel_master,
        redis_class=redis.asyncio.Redis,
        max_connections=max_connections,
        **_url_auth(settings),
        **options,
    )


def stream_sync_client(settings: Settings, **options: Any) -> SyncStreamClient | None:
    """A client of the token plane's own Redis (None: the control Redis is it); options as
    `sync_client`'s. A cluster client follows its slots (MOVED) itself."""
    if settings.token_plane_shared:
        return None
    if settings.stream_redis_cluster:
        options.pop("pool_wait_s", None)
        return redis.cluster.RedisCluster.from_url(settings.stream_redis_url, **options)
    max_connections = options.pop("max_connections", None)
    pool_wait_s = options.pop("pool_wait_s", None)
    if max_connections is None:
        return redis.Redis.from_url(settings.stream_redis_url, **options)
    pool = redis.BlockingConnectionPool.from_url(
        settings.stream_redis_url, max_connections=max_connections, timeout=pool_wait_s, **options
    )
    return redis.Redis.from_pool(pool)


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
            settings.stream_redis_url, max_connections=max_connections, **options
        )
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        settings.stream_redis_url, max_connections=max_connections, timeout=pool_wait_s, **options
    )
    return redis.asyncio.Redis.from_pool(pool)


def is_primary(role_reply: Any) -> bool:
    """Whether a `ROLE` reply comes from a primary (the only node that takes writes)."""
    role = role_reply[0]
    return (role.decode() if isinstance(role, bytes) else str(role)) == "master"
