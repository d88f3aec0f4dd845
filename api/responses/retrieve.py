"""A stored response read back, in any API process: its object (a poll), and its stream again
from the start or after a sequence number (a resume), both rendered from its job's records
by the same `ResponseEvents` that streamed it first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from tokenrelay.api.responses import store
from tokenrelay.api.responses.events import ResponseEvents
from tokenrelay.api.responses.objects import ResponseError, ResponseObject, ResponseShell
from tokenrelay.api.responses.render import ResponseSSE
from tokenrelay.api.responses.store import StoredResponse
from tokenrelay.api.state import AppState
from tokenrelay.api.streaming import job_events as hub_events
from tokenrelay.api.streaming.relay import relay
from tokenrelay.shared.errors import QueueWaitExpired
from tokenrelay.shared.events import parse_event
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import keys

LOST_MESSAGE = "the response's job records expired before the response was settled"


async def rendered(state: AppState, shell: ResponseShell) -> tuple[ResponseEvents, dict[str, str]]:
    """The response rendered from its job's event log so far, and the job's hash (empty
    once it is gone)."""
    job_id = shell.job_id
    fields = cast("dict[str, str]", await state.redis.hgetall(keys.job(job_id)))
    entries: Any = await state.plane.xrange(keys.job_events(job_id))
    events = ResponseEvents(shell, emit=False)
    finished_at = fields.get(JobField.FINISHED_AT)
    for _, entry in entries:
        events.feed(parse_event(entry["e"]), float(finished_at) if finished_at else None)
    return events, fields


async def current(state: AppState, stored: StoredResponse) -> ResponseObject:
    """The response as it stands; one whose job has ended is settled on the way."""
    if stored.final is not None:
        return stored.final
    events, fields = await rendered(state, stored.shell)
    final = events.final
    if final is None and not fields:
        error = ResponseError(code=QueueWaitExpired.error_type, message=LOST_MESSAGE)
        final = stored.shell.object("failed", [], error=error)
    if final is None:
        return events.snapshot()
    await store.settle(state, stored.shell, final, stored.expires_at)
    return final


async def resume(state: AppState, stored: StoredResponse, after: int) -> AsyncIterator[bytes]:
    """The response's stream events numbered after `after`, through its end: from the job's
    log, then live while it runs. The job runs on if the client leaves (it is stored: it
    can be polled or resumed again)."""
    job_id = stored.shell.job_id
    fields = cast("dict[str, str]", await state.redis.hgetall(keys.job(job_id)))
    render = ResponseSSE(ResponseEvents(stored.shell, skip_through=after), settler(state, stored))
    if not fields and not await state.plane.exists(keys.job_events(job_id)):
        final = await current(state, stored)  # settled failed: the job's records are gone
        error = final.error or ResponseError(code=QueueWaitExpired.error_type, message=LOST_MESSAGE)
        return _gone(ResponseEvents(stored.shell, skip_through=after), error)
    status = fields.get(JobField.STATUS)
    ended = stored.final is not None or status is None or JobStatus(status).is_terminal
    events = hub_events.job_events(state, job_id, reader=fields.get(JobField.READER), ended=ended)
    return relay(events, render)


async def _gone(events: ResponseEvents, error: ResponseError) -> AsyncIterator[bytes]:
    yield events.created() + events.failed(error.code, error.message)


def settler(state: AppState, stored: StoredResponse) -> Callable[[ResponseObject], None] | None:
    """`on_final` of a stored response's stream: settle it in the background."""
    if stored.final is not None:
        return None
    return lambda final: state.spawn(store.settle(state, stored.shell, final, stored.expires_at))
