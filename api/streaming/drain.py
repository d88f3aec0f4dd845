"""Ending the streams that outlive a stopping API process's drain, with a last word.

On SIGTERM (or SIGINT) uvicorn stops accepting connections and lets the responses in
progress run for its graceful shutdown, `TOKENRELAY_API_DRAIN_S` (`tokenrelay api`); a
response still running then has its task cancelled, which cuts the client's stream mid-body
and logs a traceback. This module hooks the same signals, after uvicorn's own handlers, and
shortly before that deadline ends every stream still open through the hub
(`StreamHub.close_streams`): each gets its renderer's last word (an `api_shutting_down`
error, then the stream's end), and a foreground job is cancelled as when its client leaves,
so the process stops with nothing cut and nothing logged as a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from tokenrelay.api.streaming.hub import StreamHub

MARGIN_S = 1.0
"""How long before the drain's end the streams still open are ended."""
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def streams_end_before_drain(hub: StreamHub, drain_s: float) -> Iterator[None]:
    """While in the block, a stop signal (after whatever handled it before: uvicorn's) ends
    the hub's open streams `drain_s - MARGIN_S` seconds later. Only a process's main thread
    can handle signals: elsewhere (an app in a test client's thread) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    delay = max(0.0, drain_s - MARGIN_S)
    scheduled: list[asyncio.TimerHandle] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        if not scheduled:
            scheduled.append(loop.call_later(delay, hub.close_streams))

    previous: dict[int, Any] = {signum: signal.signal(signum, on_signal) for signum in _SIGNALS}
    try:
        yield
    finally:
        for timer in scheduled:
            timer.cancel()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
