"""The long-lived objects of one API process, built by `api.app.build_state` and kept on
`app.state`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.asyncio
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster

from tokenrelay.api.api_keys import KeyRing
from tokenrelay.shared.redis import connect as redis_connect
from tokenrelay.shared.redis.scripts import AsyncScripts
from tokenrelay.shared.settings import Settings

if TYPE_CHECKING:  # built by `api.app.build_state`: the features sit above this module
    from tokenrelay.api.jobs.placement import Placement
    from tokenrelay.api.jobs.prompt_fit import PromptFit
    from tokenrelay.api.streaming.hub import StreamHub


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
    placement: Placement
    connector: redis_connect.RedisConnector
    #: Set when this process records a batch, to wake its idle batch feeder at once.
    batch_created: asyncio.Event = field(default_factory=asyncio.Event)
    _background: set[asyncio.Task[Any]] = field(default_factory=set)

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
