"""The API's share of lease reaping: any live process ends jobs whose lease expired, and
closes the logs of jobs ended so on a token plane of its own (`shared.redis.token_plane`)."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from tokenrelay.api.state import AppState
from tokenrelay.shared.redis import job_scripts
from tokenrelay.shared.redis.rq_jobs import fail_lost_jobs
from tokenrelay.shared.redis.token_plane import drain_outbox

log = logging.getLogger(__name__)


async def reap_forever(state: AppState) -> None:
    interval_s = state.settings.lease_ttl_s / 3
    while True:
        await asyncio.sleep(interval_s)
        try:
            lost = await state.scripts.run(job_scripts.reap(state.settings))
            if lost:
                await asyncio.to_thread(
                    fail_lost_jobs, state.rq_connection, lost, state.settings.result_ttl_s
                )
            await drain_outbox(state.redis, state.plane_scripts, state.settings)
        except RedisError as exc:
            log.warning("lease reaping skipped: %s", exc)
