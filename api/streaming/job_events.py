"""The one constructor of a job's event iterator: what every route that streams or collects
a job reads from the stream hub."""

from __future__ import annotations

from collections.abc import AsyncIterator

from tokenrelay.api.state import AppState
from tokenrelay.api.streaming.hub import StreamItem
from tokenrelay.api.streaming.observer import observe_events


def job_events(
    state: AppState,
    job_id: str,
    *,
    reader: str | None,
    after_seq: int = -1,
    ended: bool = False,
    observed: bool = False,
) -> AsyncIterator[StreamItem]:
    """The events of `job_id` (its reader `reader`) after `after_seq`, a heartbeat every
    `TOKENRELAY_SSE_PING_S` of silence; `observed`, they feed the latency and token metrics
    and the request's log line (`api.streaming.observer`), for a generation streamed back to
    the request that made it."""
    events = state.hub.events(
        job_id, reader=reader, after_seq=after_seq, idle_s=state.settings.sse_ping_s, ended=ended
    )
    return observe_events(state.redis, job_id, events) if observed else events


def requested_here(state: AppState, job_id: str) -> AsyncIterator[StreamItem]:
    """The observed events of a job this API process submitted for a request it serves (its
    reader is this process: `read_here`)."""
    return job_events(state, job_id, reader=state.hub.reader_id, observed=True)
