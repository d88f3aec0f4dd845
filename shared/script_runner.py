"""Run `ScriptCall`s on a sync (worker) or async (API) Redis client.

Each runner registers a script once (`SCRIPT LOAD` on first use, `EVALSHA` afterwards;
redis-py reloads it if the server lost it, for example after a restart). A Redis Cluster
client (the token plane's, `shared.redis_connect`) sends each call to the node owning its
keys' slot.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.commands.core import AsyncScript, Script

from tokenrelay.shared.scripts import ScriptCall


class SyncScripts:
    def __init__(self, client: redis.Redis | redis.cluster.RedisCluster) -> None:
        self._client = client
        self._registered: dict[str, Script] = {}

    def run(self, call: ScriptCall, client: redis.Redis | None = None) -> Any:
        """Run `call`; on `client` (a client of the same server) instead of this runner's."""
        script = self._registered.get(call.source)
        if script is None:
            script = self._registered[call.source] = self._client.register_script(call.source)
        return script(keys=call.keys, args=call.args, client=client)


class AsyncScripts:
    def __init__(self, client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster) -> None:
        self._client = client
        self._registered: dict[str, AsyncScript] = {}

    async def run(self, call: ScriptCall) -> Any:
        script = self._registered.get(call.source)
        if script is None:
            script = self._registered[call.source] = self._client.register_script(call.source)
        return await script(keys=call.keys, args=call.args)
