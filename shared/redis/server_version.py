"""The oldest Redis server tokenrelay runs on, checked when an API or worker process starts.

Redis 7.0 (or Valkey, which reports a `redis_version` of 7.2.4 or later) is the minimum:
Redis 6.2 is past its end of life, and the token plane builds on 7.0 (sharded pub/sub, XADD
with an automatic sequence number). A process that finds an older server refuses to start
with `RedisTooOld`; one that cannot reach Redis at all starts anyway and reports not ready
until it can (`/readyz`), as it does after any outage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio

from tokenrelay.shared.settings import Settings

MIN_REDIS_VERSION = (7, 0)


class RedisTooOld(RuntimeError):
    """The Redis server is older than `MIN_REDIS_VERSION`."""


def _version(info: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(int(part) for part in str(info["redis_version"]).split(".")[:2])


def check_info(info: Mapping[str, Any], where: str) -> None:
    """Raise `RedisTooOld` when `INFO server` (`info`) names a server older than the minimum."""
    if _version(info) < MIN_REDIS_VERSION:
        minimum = ".".join(map(str, MIN_REDIS_VERSION))
        raise RedisTooOld(
            f"the Redis server at {where} runs version {info['redis_version']}; tokenrelay "
            f"needs Redis >= {minimum} (or Valkey): upgrade it, or point TOKENRELAY_REDIS_URL "
            "at a newer server"
        )


def server_name(settings: Settings) -> str:
    """The server of `settings`, for messages: host and port, never the password."""
    if settings.redis_sentinels:
        return f"the primary of {settings.redis_sentinel_master!r}"
    parts = urlsplit(settings.redis_url)
    return f"{parts.hostname}:{parts.port or 6379}"


def check_sync(client: redis.Redis, settings: Settings) -> None:
    """Check the server `client` reaches; an unreachable one is left to readiness."""
    try:
        info = client.info("server")
    except redis.RedisError:
        return
    check_info(info, server_name(settings))


async def check_async(client: redis.asyncio.Redis, settings: Settings) -> None:
    """Check the server `client` reaches; an unreachable one is left to readiness."""
    try:
        info = await client.info("server")
    except redis.RedisError:
        return
    check_info(info, server_name(settings))
