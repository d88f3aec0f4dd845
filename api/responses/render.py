"""The Responses stream as a `relay` renderer: each job event through `ResponseEvents`, pings
as SSE comments, and the ended response handed to `on_final` (to settle a stored one).

HOT PATH: `event` runs once per token event of every Responses stream (docs/architecture.md,
"The per-token path")."""

from __future__ import annotations

from collections.abc import Callable

from tokenrelay.api.responses.events import ResponseEvents
from tokenrelay.api.responses.objects import ResponseObject
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.hub import Delivery
from tokenrelay.shared.errors import ApiShuttingDown, RedisUnavailable


class ResponseSSE:
    def __init__(
        self, events: ResponseEvents, on_final: Callable[[ResponseObject], None] | None = None
    ) -> None:
        self._events = events
        self._on_final = on_final

    def start(self) -> bytes:
        return self._events.created()

    def event(self, delivery: Delivery) -> bytes:
        event = delivery.event
        out = self._events.feed(event)
        if event.type != "token" and self._events.final is not None and self._on_final:
            self._on_final(self._events.final)
            self._on_final = None
        return out

    def ping(self) -> bytes:
        return sse.comment()

    def lost_redis(self) -> bytes:
        message = "lost Redis while streaming; resume with `starting_after`"
        return self._events.interrupted(RedisUnavailable.error_type, message)

    def closing(self) -> bytes:
        message = (
            "the API process serving this stream is stopping; a background response runs on "
            "(resume it with `starting_after`), a foreground one is cancelled"
        )
        return self._events.interrupted(ApiShuttingDown.error_type, message)

    def end(self) -> None:
        return None
