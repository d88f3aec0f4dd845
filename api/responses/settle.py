"""Settle the stored responses nobody is reading: every API process, every
`SETTLE_INTERVAL_S`, settles those whose job has ended (a background response no one
streams or polls, a stream whose API process died), before their job's records expire
(`TOKENRELAY_RESULT_TTL_S`) and with them the output. Any number of processes may settle
the same response: it is written alike (`api.responses.store`)."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from tokenrelay.api.responses import store
from tokenrelay.api.responses.retrieve import current
from tokenrelay.api.state import AppState
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import keys

log = logging.getLogger(__name__)

SETTLE_INTERVAL_S = 2.0
#: The most unsettled responses one pass looks at (the oldest first).
SETTLE_BATCH = 1000


async def settle_forever(state: AppState) -> None:
    while True:
        await asyncio.sleep(SETTLE_INTERVAL_S)
        try:
            await settle_ended(state)
        except RedisError as exc:
            log.warning("settling stored responses skipped: %s", exc)


async def settle_ended(state: AppState) -> int:
    """Settle the unsettled responses whose job has ended (or is gone); returns how many."""
    ids = await store.unsettled(state, SETTLE_BATCH)
    async with state.redis.pipeline(transaction=False) as pipe:
        for response_id in ids:
            pipe.hget(keys.job(store.job_id_of(response_id) or ""), JobField.STATUS)
        statuses = await pipe.execute()
    settled = 0
    for response_id, status in zip(ids, statuses, strict=True):
        if status is not None and not JobStatus(status).is_terminal:
            continue
        found = await store.load_any(state, response_id)
        if found is None:
            await store.forget_unsettled(state, response_id)
            continue
        await current(state, found[1])
        settled += 1
    return settled
