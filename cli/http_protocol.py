"""uvicorn's HTTP protocols with read deadlines, against slow and idle clients (slowloris).

uvicorn closes a kept-alive connection idle between requests (`timeout_keep_alive`), but
waits forever for a request that has begun: a client that opens a connection and sends
nothing, or sends its headers a line at a time, holds the connection as long as it likes.
Here a request's head must be complete within `header_timeout_s` of the connection opening
(or of its first byte, on a kept-alive connection), and its body within `body_timeout_s` of
the head. A request that misses its deadline gets `408 Request Timeout` (when no response
has started) and its connection is closed; the app sees a client disconnect.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nrequest read timeout\n"
)

Phase = Literal["head", "body"]


class ReadDeadlines:
    """The deadline logic, mixed into a uvicorn protocol class (which provides `loop`,
    `transport` and `cycle`)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def _init_deadlines(self, header_timeout_s: float, body_timeout_s: float) -> None:
        self._timeouts: dict[Phase, float] = {"head": header_timeout_s, "body": body_timeout_s}
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: Phase | None = None

    def _arm(self, phase: Phase) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(self._timeouts[phase], self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._phase = None

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_TIMEOUT_RESPONSE)
            if self.cycle is not None:
                self.cycle.response_started = True  # the app's own answer is dropped
        self.transport.close()


class DeadlineHttpToolsProtocol(ReadDeadlines, HttpToolsProtocol):
    """httptools (what uvicorn's `http="auto"` runs): the parser's callbacks mark the start,
    head and end of each request."""

    def __init__(self, *args: Any, header_timeout_s: float, body_timeout_s: float, **kw: Any):
        super().__init__(*args, **kw)
        self._init_deadlines(header_timeout_s, body_timeout_s)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("head")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm("head")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm("body")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_factory(header_timeout_s: float, body_timeout_s: float) -> Any:
    """What to pass as uvicorn's `http`: it calls this with the protocol's usual arguments
    (a partial of a module-level class, so `--workers` can pickle it)."""
    return functools.partial(
        DeadlineHttpToolsProtocol,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
    )
