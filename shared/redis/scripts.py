"""The one loader and runner of tokenrelay's Lua scripts.

Sources are files of `shared/redis/lua/` (package resources, each with a header listing its
KEYS and ARGV), joined in order into one script by `load`: `clock.lua` (`now_ms`, the one
reader of Redis `TIME`, so the clocks of API nodes and workers never matter) comes first in
every script that reads the time. Each family's module builds its scripts and typed
wrappers on this one: `job_scripts` (admission, a job's lease and end, on the job library),
`plane_scripts` (the token plane: a job's event log and channel), `batch_scripts` (the
batch feeder's claims and results), `webhook_scripts` (the webhook delivery queue).

A wrapper builds a `ScriptCall`; the async API and the sync worker each run it on their own
client (`AsyncScripts`, `SyncScripts`), which registers a script once (`SCRIPT LOAD` on
first use, `EVALSHA` afterwards; redis-py reloads it if the server lost it, for example
after a restart). A Redis Cluster client (the token plane's, `shared.redis.connect`) sends
each call to the node owning its keys' slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.commands.core import AsyncScript, Script

LUA_SOURCES = files("tokenrelay.shared.redis") / "lua"
"""The folder of `.lua` files (a package resource)."""

Arg = str | int | float | bytes


def load(*names: str) -> str:
    """The named files of `LUA_SOURCES`, joined in order into one script."""
    return "\n".join((LUA_SOURCES / name).read_text(encoding="utf-8") for name in names)


def timed(name: str) -> str:
    """A script that reads the time but ends no job: the clock, then the script."""
    return load("clock.lua", name)


@dataclass(frozen=True)
class ScriptCall:
    """One script invocation, ready for a sync or async Redis client."""

    source: str
    keys: list[str]
    args: list[Arg]


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
