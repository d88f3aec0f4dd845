"""The long-lived objects of one API process, built by `create_app` and kept on `app.state`."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
from redis import Redis

from api.streams import StreamHub
from shared.script_runner import AsyncScripts
from shared.settings import Settings


def hash_key(api_key: str) -> str:
    """API keys are kept only as SHA-256 hashes; a caller's owner id is derived from it."""
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclass
class AppState:
    settings: Settings
    redis: redis.asyncio.Redis
    rq_connection: Redis
    scripts: AsyncScripts
    hub: StreamHub
    api_key_hashes: frozenset[str]
    _background: set[asyncio.Task[Any]] = field(default_factory=set)

    @classmethod
    def build(cls, settings: Settings) -> AppState:
        client = redis.asyncio.Redis.from_url(
            settings.redis_url, decode_responses=True, health_check_interval=30
        )
        return cls(
            settings=settings,
            redis=client,
            rq_connection=Redis.from_url(settings.redis_url),
            scripts=AsyncScripts(client),
            hub=StreamHub(client),
            api_key_hashes=frozenset(hash_key(key) for key in settings.api_keys),
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
        await self.redis.aclose()
        self.rq_connection.close()
