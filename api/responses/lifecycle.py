"""Ending a stored response early: cancel a background one, delete any."""

from __future__ import annotations

import asyncio
import contextlib
from typing import cast

from tokenrelay.api.jobs import control
from tokenrelay.api.responses import store
from tokenrelay.api.responses.objects import ResponseObject
from tokenrelay.api.responses.retrieve import current
from tokenrelay.api.responses.store import StoredResponse
from tokenrelay.api.state import AppState
from tokenrelay.api.streaming import job_events as hub_events
from tokenrelay.api.streaming.hub import Delivery
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.events import is_terminal
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import keys

#: How long a cancel waits for a running job's worker to stop it (at its next decoding
#: step), to answer the response as it ended.
CANCEL_WAIT_S = 10.0


async def cancel(state: AppState, stored: StoredResponse) -> ResponseObject:
    """Cancel a background response: a queued job ends at once, a running one at its
    worker's next decoding step; answers the response once its job has ended (or, past
    `CANCEL_WAIT_S`, as it stands)."""
    if not stored.shell.echo.background:
        raise InvalidRequest(
            "only a `background` response can be cancelled (a streamed one is cancelled by "
            "leaving its stream)",
            param="response_id",
        )
    job_id = stored.shell.job_id
    if stored.final is None:
        await control.cancel(state, job_id)
        reader = cast("str | None", await state.redis.hget(keys.job(job_id), JobField.READER))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT_S):
                async for item in hub_events.job_events(state, job_id, reader=reader):
                    if isinstance(item, Delivery) and is_terminal(item.event):
                        break
    return await current(state, await _reload(state, stored))


async def delete(state: AppState, stored: StoredResponse) -> None:
    """Forget the response and its job's records; a job still running is cancelled first
    (nothing could read it any more)."""
    job_id = stored.shell.job_id
    status = cast("str | None", await state.redis.hget(keys.job(job_id), JobField.STATUS))
    running = status is not None and not JobStatus(status).is_terminal
    if running:
        await control.cancel_quietly(state, job_id)
    await store.delete(state, stored.shell.id, job_id, job_ended=not running)


async def _reload(state: AppState, stored: StoredResponse) -> StoredResponse:
    found = await store.load_any(state, stored.shell.id)
    return stored if found is None else found[1]
