"""The long-lived objects of one API process, built by `create_app` and kept on `app.state`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster

from tokenrelay.api.api_keys import KeyRing
from tokenrelay.api.prompt_fit import PromptFit
from tokenrelay.api.streams import StreamHub
from tokenrelay.shared import redis_connect
from tokenrelay.shared.script_runner import AsyncScripts
from tokenrelay.shared.settings import Settings

REDIS_POOL_WAIT_S = 5.0
BYTES_POOL_SIZE = 8
REDIS_CONNECT_TIMEOUT_S = 5.0  # an unreachable Redis (no RST) is a 503, not a 2-minute hang
REDIS_HEALTH_CHECK_S = 30


@dataclass
class AppState:
    settings: Settings
    #: The same Redis as `redis` without response decoding: file content is bytes.
    redis_bytes: redis.asyncio.Redis
    redis: redis.asyncio.Redis
    #: The token plane's Redis (`TOKENRELAY_STREAM_REDIS_URL`): `redis` when it holds both.
    plane: AsyncRedis | RedisCluster
    rq_connection: Redis
    scripts: AsyncScripts
    #: Scripts on `plane`: `scripts` when one Redis holds both planes.
    plane_scripts: AsyncScripts
    hub: StreamHub
    keys: KeyRing
    prompt_fit: PromptFit
    connector: redis_connect.RedisConnector
    #: Set when this process records a batch, to wake its idle batch feeder at once.
    batch_created: asyncio.Event = field(default_factory=asyncio.Event)
    _background: set[asyncio.Task[Any]] = field(default_factory=set)

    @classmethod
    def build(cls, settings: Settings) -> AppState:
        # A burst of requests waits briefly for a pooled connection instead of failing with
        # "Too many connections" (redis-py's default pool caps at 100 and refuses the rest);
        # the pool, and beside it the stream hub's one pub/sub connection, bound this
        # process's connections whatever the number of streams (`TOKENRELAY_REDIS_POOL_SIZE`).
        # Every call fails after `TOKENRELAY_API_REDIS_TIMEOUT_S` instead of hanging on a
        # server that stopped answering (a frozen primary never closes its connections), and
        # redis-py's retry reconnects, through the sentinels, to the primary they name.
        connector = redis_connect.RedisConnector(settings)
        options: dict[str, Any] = {
            "pool_wait_s": REDIS_POOL_WAIT_S,
            "socket_timeout": settings.api_redis_timeout_s,
            "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
            "health_check_interval": REDIS_HEALTH_CHECK_S,
        }
        client = connector.async_client(
            max_connections=settings.redis_pool_size, decode_responses=True, **options
        )
        control_scripts = AsyncScripts(client)
        plane = redis_connect.stream_async_client(
            settings, max_connections=settings.redis_pool_size, decode_responses=True, **options
        )
        return cls(
            settings=settings,
            redis=client,
            plane=client if plane is None else plane,
            redis_bytes=connector.async_client(
                max_connections=BYTES_POOL_SIZE, decode_responses=False, **options
            ),
            rq_connection=connector.sync_client(
                max_connections=settings.redis_pool_size, **options
            ),
            scripts=control_scripts,
            plane_scripts=control_scripts if plane is None else AsyncScripts(plane),
            hub=StreamHub(client if plane is None else plane, plane_shared=plane is None),
            keys=KeyRing.from_settings(settings),
            prompt_fit=PromptFit(client),
            connector=connector,
        )

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run `work` in the background, surviving the request task that started it."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        await self.hub.close()
        self.prompt_fit.close()
        await self.redis.aclose()
        if self.plane is not self.redis:
            await self.plane.aclose()
        await self.redis_bytes.aclose()
        self.rq_connection.close()
        await self.connector.aclose()
