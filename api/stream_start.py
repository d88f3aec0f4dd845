"""Hold a streaming chat completion's status line until the job's first output.

The API has no tokenizer: only the worker can tell that a prompt exceeds the model's context
window, and a queued job can expire before any worker takes it. So a streaming request waits
for its job's first token (or its end) before the response starts, and an error that comes
first is answered like a non-streaming one (400 `context_length_exceeded`, 503 `expired`)
rather than as a 200 whose first event is an error. The wait lasts one ping interval
(`TOKENRELAY_SSE_PING_S`) at most: then the stream starts with a ping, and a later error
arrives as an error event. A client that leaves while it waits has its job cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.types import Receive

from tokenrelay.api.job_control import cancel_quietly
from tokenrelay.api.state import AppState
from tokenrelay.api.stream_observer import observe_events
from tokenrelay.api.streams import Delivery, StreamItem
from tokenrelay.shared.errors import JobCancelled, from_type
from tokenrelay.shared.events import Error, Started


async def first_output(state: AppState, job_id: str, receive: Receive) -> AsyncIterator[StreamItem]:
    """The job's events, returned once its first output (or a heartbeat) arrived.

    Raises the job's error if it ended before its first token, and `JobCancelled` (after
    cancelling the job) if the client disconnected first.
    """
    reader = state.hub.reader_id  # the streaming routes submit their job `read_here`
    hub_events = state.hub.events(job_id, reader=reader, idle_s=state.settings.sse_ping_s)
    events = observe_events(state.redis, job_id, hub_events)
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
        state.spawn(cancel_quietly(state, job_id))
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
