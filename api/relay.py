"""Relay a job's events to a client in some wire format, or collect them into one result.

Every streaming endpoint (chat and text completions, the two articles' shapes) differs
only in how it renders text, the end, an error and a keep-alive; `relay` owns the rest:
Redis trouble ends the stream with an error, and a client that leaves cancels its job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from redis.exceptions import RedisError

from api.job_control import cancel_quietly
from api.metrics import observe_events
from api.state import AppState
from api.stream_start import StreamItem
from api.streams import Heartbeat
from shared.errors import RedisUnavailable, TokenrelayError, from_type
from shared.events import Done, Error, TokenChunk


class Renderer(Protocol):
    def text(self, text: str) -> bytes | None: ...

    def done(self, event: Done) -> bytes | None: ...

    def error(self, exc: TokenrelayError) -> bytes: ...

    def ping(self) -> bytes | None: ...

    def end(self) -> bytes | None: ...


async def relay(
    state: AppState, job_id: str, events: AsyncIterator[StreamItem], render: Renderer
) -> AsyncIterator[bytes]:
    ended = False
    try:
        async for event in events:
            if isinstance(event, TokenChunk):
                out = render.text(event.text)
            elif isinstance(event, Done):
                out = render.done(event)
            elif isinstance(event, Error):
                out = render.error(from_type(event.error_type, event.message))
            elif isinstance(event, Heartbeat):
                out = render.ping()
            else:
                out = None
            if out:
                yield out
        ended = True
    except RedisError:
        yield render.error(RedisUnavailable("lost Redis while streaming; the job may still finish"))
        ended = True
    finally:
        if not ended:
            state.spawn(cancel_quietly(state, job_id))
    if (tail := render.end()) is not None:
        yield tail


async def collect(state: AppState, job_id: str) -> tuple[str, Done]:
    """The job's whole text and its `Done` event; raises the job's error if it failed."""
    parts: list[str] = []
    events = state.hub.events(job_id, idle_s=state.settings.sse_ping_s)
    async for event in observe_events(state.redis, job_id, events):
        if isinstance(event, TokenChunk):
            parts.append(event.text)
        elif isinstance(event, Done):
            return "".join(parts), event
        elif isinstance(event, Error):
            raise from_type(event.error_type, event.message)
    raise TokenrelayError("the job's event stream ended without a final event")
