"""The one relay from a job's hub events to a client's bytes, and the collector of a result.

Every streaming route (chat and text completions, the two articles' shapes, a job's event
stream) differs only in its `Renderer`, the bytes of each part of the stream; `relay` owns
the rest: Redis trouble ends the stream with the renderer's error, and a client that leaves
before the end runs the route's `on_leave` (cancelling the job, unless the route lets it run
on without a listener), as does a stream this process ends because it stops
(`StreamHub.close_streams`), after the renderer's word for it. HOT PATH: every relayed token
passes `relay` and its renderer (docs/architecture.md, "The per-token path"); measure with
`python -m bench.gateway` before and after changing it.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from redis.exceptions import RedisError

from tokenrelay.api.state import AppState
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.hub import Delivery, Heartbeat, StreamItem, StreamsClosing
from tokenrelay.api.streaming.job_events import requested_here
from tokenrelay.shared.errors import (
    ApiShuttingDown,
    RedisUnavailable,
    TokenrelayError,
    from_type,
)
from tokenrelay.shared.events import Done, Error, TokenChunk, TokenLogprob


class Renderer(Protocol):
    """One wire format: the bytes of each part of a stream, `None` (or empty) for nothing."""

    def start(self) -> bytes | None: ...

    def event(self, delivery: Delivery) -> bytes | None: ...

    def ping(self) -> bytes | None: ...

    def lost_redis(self) -> bytes: ...

    def closing(self) -> bytes:
        """The last word of a stream this process ends because it stops."""
        ...

    def end(self) -> bytes | None: ...


class GenerationRenderer(ABC):
    """A `Renderer` of generated text: a subclass writes text, the end and an error, and
    `event` picks which from the event's type (a `Started` event sends nothing)."""

    def start(self) -> bytes | None:
        return None

    def event(self, delivery: Delivery) -> bytes | None:
        event = delivery.event
        if isinstance(event, TokenChunk):
            if event.logprobs is not None:
                return self.text_with_logprobs(event.text, event.logprobs)
            return self.text(event.text) if event.text else None
        if isinstance(event, Done):
            return self.done(event)
        if isinstance(event, Error):
            return self.error(from_type(event.error_type, event.message))
        return None

    def lost_redis(self) -> bytes:
        return self.error(RedisUnavailable("lost Redis while streaming; the job may still finish"))

    def closing(self) -> bytes:
        return self.error(
            ApiShuttingDown("the API process serving this stream is stopping; the job is cancelled")
        )

    @abstractmethod
    def text(self, text: str) -> bytes | None: ...

    def text_with_logprobs(self, text: str, logprobs: list[TokenLogprob]) -> bytes | None:
        """A chunk of a job that asked for log probabilities; formats without them send
        the text alone."""
        return self.text(text)

    @abstractmethod
    def done(self, event: Done) -> bytes | None: ...

    @abstractmethod
    def error(self, exc: TokenrelayError) -> bytes: ...

    @abstractmethod
    def ping(self) -> bytes | None: ...

    @abstractmethod
    def end(self) -> bytes | None: ...


class OpenAIStreamRenderer(GenerationRenderer):
    """OpenAI's stream framing, shared by chat and text completions: the response id and
    creation time of every chunk, an error as `data: {"error": {...}}` (vLLM's shape), ping
    comments and `data: [DONE]`."""

    def __init__(self, response_id: str, model: str, include_usage: bool) -> None:
        self._id = response_id
        self._model = model
        self._created = int(time.time())
        self._include_usage = include_usage

    def error(self, exc: TokenrelayError) -> bytes:
        return sse.encode(json.dumps(exc.body()))

    def ping(self) -> bytes:
        return sse.comment()

    def end(self) -> bytes:
        return sse.encode("[DONE]")


async def relay(
    events: AsyncIterator[StreamItem],
    render: Renderer,
    *,
    on_leave: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """`render.start()`, `events` in `render`'s format, then `render.end()`; a client that
    leaves before the end runs `on_leave`. The start goes out with what follows it, in one
    write: a client then wakes once for its first token."""
    ended = False
    head = render.start() or b""
    try:
        async for item in events:
            out = render.ping() if isinstance(item, Heartbeat) else render.event(item)
            if out:
                if head:  # only the first: the per-token path concatenates nothing
                    out, head = head + out, b""
                yield out
        ended = True
    except RedisError:
        yield head + render.lost_redis()
        head = b""
        ended = True
    except StreamsClosing:
        yield head + render.closing()
        head = b""
    finally:
        if not ended and on_leave is not None:
            on_leave()
    if closing := head + (render.end() or b""):
        yield closing


async def merge(streams: list[AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """The frames of several relays, each as it comes; leaving early closes them all (and so
    cancels their jobs)."""
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[bytes]) -> None:
        try:
            async for frame in stream:
                await queue.put(frame)
        except Exception as exc:
            await queue.put(exc)
        await queue.put(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class Collected:
    """A finished job's whole text, its `Done` event, and its tokens' log probabilities
    (None unless it asked for them)."""

    text: str
    done: Done
    logprobs: list[TokenLogprob] | None


async def collect(state: AppState, job_id: str) -> Collected:
    """The job's whole result; raises the job's error if it failed."""
    parts: list[str] = []
    logprobs: list[TokenLogprob] | None = None
    async for item in requested_here(state, job_id):
        if isinstance(item, Heartbeat):
            continue
        event = item.event
        if isinstance(event, TokenChunk):
            parts.append(event.text)
            if event.logprobs is not None:
                logprobs = (logprobs or []) + event.logprobs
        elif isinstance(event, Done):
            return Collected("".join(parts), event, logprobs)
        elif isinstance(event, Error):
            raise from_type(event.error_type, event.message)
    raise TokenrelayError("the job's event stream ended without a final event")
