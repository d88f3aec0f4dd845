"""Hold a streaming chat completion's status line until the job's first output.

Admission counts a prompt's tokens (`api.jobs.prompt_fit`), but only the worker holds the
exact prompt it will run (a chat template's rendering, a model its workers publish no
limits for yet), and a queued job can expire before any worker takes it. So a streaming
request waits for its job's first token (or its end) before the response starts, and an
error that comes first is answered like a non-streaming one (400 `context_length_exceeded`,
503 `expired`) rather than as a 200 whose first event is an error. The wait lasts one ping interval
(`TOKENRELAY_SSE_PING_S`) at most: then the stream starts with a ping, and a later error
arrives as an error event. A client that leaves while it waits runs the route's `on_leave`
(which cancels its job).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.types import Receive

from tokenrelay.api.state import AppState
from tokenrelay.api.streaming.hub import Delivery, StreamItem
from tokenrelay.api.streaming.job_events import requested_here
from tokenrelay.shared.errors import JobCancelled, from_type
from tokenrelay.shared.events import Error, Started


async def first_output(
    state: AppState, job_id: str, receive: Receive, on_leave: Callable[[], None]
) -> AsyncIterator[StreamItem]:
    """The job's events, returned once its first output (or a heartbeat) arrived.

    Raises the job's error if it ended before its first token, and `JobCancelled` (after
    `on_leave`) if the client disconnected first.
    """
    events = requested_here(state, job_id)
    head: list[StreamItem] = []

    async def read_head() -> None:
        async for item in events:
            head.append(item)
            if not (isinstance(item, Delivery) and isinstance(item.event, Started)):
                return

    reading = asyncio.ensure_future(read_head())
    leaving = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((reading, leaving), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (reading, leaving):
            task.cancel()
        await asyncio.gather(reading, leaving, return_exceptions=True)
    if reading.cancelled():
        on_leave()
        raise JobCancelled("the client disconnected before the first token")
    if (failure := reading.exception()) is not None:
        raise failure
    last = head[-1].event if head and isinstance(head[-1], Delivery) else None
    if isinstance(last, Error):
        raise from_type(last.error_type, last.message)
    return _chain(head, events)


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _chain(
    head: list[StreamItem], rest: AsyncIterator[StreamItem]
) -> AsyncIterator[StreamItem]:
    for item in head:
        yield item
    async for item in rest:
        yield item
