"""Closing the event logs of jobs ended on the control Redis, where the token plane is a Redis
of its own (`TOKENRELAY_STREAM_REDIS_URL`).

A job ended by anyone but its worker (the lease reaper, a cancel before start, START finding
its queue wait over) is ended by a control-side script, which cannot reach the job's log: it
leaves the job's final event in the outbox (`keys.token_plane_outbox()`) in the same script.
`drain_outbox` (the API's reaper loop and each cancel, the workers' lease keepers) appends
each to its log with CLOSE, which adds nothing to a log closed already, then takes it out of
the outbox: a process dying in between leaves the entry for the next drain, so every such log
is closed, at most a reaper interval late.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from tokenrelay.shared.redis import keys, plane_scripts
from tokenrelay.shared.redis.replies import as_text
from tokenrelay.shared.redis.scripts import AsyncScripts, SyncScripts
from tokenrelay.shared.settings import Settings

_DRAIN_BATCH = 100


def _pending(entries: Any) -> list[tuple[str, str]]:
    return [(as_text(job_id), as_text(event)) for job_id, event in entries.items()]


async def drain_outbox(
    control: redis.asyncio.Redis, plane: AsyncScripts, settings: Settings
) -> int:
    """Close the logs of the outbox's jobs; returns how many it closed."""
    if settings.token_plane_shared:
        return 0
    outbox = keys.token_plane_outbox()
    _, entries = await control.hscan(outbox, count=_DRAIN_BATCH)
    pending = _pending(entries)
    for job_id, event in pending:
        await plane.run(plane_scripts.close_log(settings, job_id, event))
        await control.hdel(outbox, job_id)
    return len(pending)


def drain_outbox_sync(control: redis.Redis, plane: SyncScripts, settings: Settings) -> int:
    """`drain_outbox` for a worker's threads."""
    if settings.token_plane_shared:
        return 0
    outbox = keys.token_plane_outbox()
    _, entries = control.hscan(outbox, count=_DRAIN_BATCH)
    pending = _pending(entries)
    for job_id, event in pending:
        plane.run(plane_scripts.close_log(settings, job_id, event))
        control.hdel(outbox, job_id)
    return len(pending)
