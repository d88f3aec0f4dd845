"""The batch feeder's Lua scripts (`shared/redis/lua/batch_*.lua`), with typed wrappers."""

from __future__ import annotations

from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.scripts import LUA_SOURCES, Arg, ScriptCall


def _load(*names: str) -> str:
    return "\n".join((LUA_SOURCES / name).read_text(encoding="utf-8") for name in names)


BATCH_CLAIM = _load("clock.lua", "batch_claim.lua")
BATCH_RESULT = _load("batch_result.lua")


def claim(
    feeder: str, lease_ms: int, max_new: int, held: list[str], feeder_field: str
) -> ScriptCall:
    """Renew the batches `feeder` holds and claim up to `max_new` unheld ones (see the
    script's header); the reply is `{claimed ids, lost ids}`."""
    template = keys.batch(keys.ID_PLACEHOLDER)
    args: list[Arg] = [feeder, lease_ms, max_new, template, feeder_field, *held]
    return ScriptCall(BATCH_CLAIM, [keys.active_batches()], args)


def result(batch_id: str, line: int, value: str, count_field: str) -> ScriptCall:
    """Write line `line`'s result once; the reply is 1 when this call wrote it."""
    script_keys = [keys.batch_results(batch_id), keys.batch(batch_id), keys.batch_pending(batch_id)]
    return ScriptCall(BATCH_RESULT, script_keys, [line, value, count_field])
