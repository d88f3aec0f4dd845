"""Refuse request bodies over `TOKENRELAY_MAX_REQUEST_BYTES` with a 413, as pure ASGI.

A declared `Content-Length` over the limit is refused before the body is read; one within
it needs no counting (the server reads no more than is declared), and GET and HEAD routes
read no body: those requests pass through untouched, their (SSE) responses unwrapped. A
body of undeclared length (chunked) is counted as it streams in: the read that crosses the
limit raises `BodyTooLarge`, and whatever response the app then starts (FastAPI turns a
failed body read into a 400) is replaced by the 413. The app never holds more than the
limit.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenrelay.api.errors import respond
from tokenrelay.shared.errors import PayloadTooLarge


class BodyTooLarge(Exception):
    """Raised into the app by `receive` when the streamed body crosses the limit."""


class BodySizeLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, path_limits: Mapping[str, tuple[int, str]] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = path_limits or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, setting = self.path_limits.get(
            scope["path"], (self.max_bytes, "TOKENRELAY_MAX_REQUEST_BYTES")
        )
        declared = _content_length(scope)
        if declared is not None and declared > max_bytes:
            error = PayloadTooLarge(
                f"the request body is {declared} bytes; the limit is {max_bytes} ({setting})"
            )
            await respond(scope, error)(scope, receive, send)
            return
        if declared is not None or scope["method"] in _BODILESS_METHODS:
            await self.app(scope, receive, send)
            return
        guard = _Guard(receive, send, max_bytes, setting)
        try:
            await self.app(scope, guard.receive, guard.send)
        except BodyTooLarge:
            if guard.started:
                raise
        if guard.exceeded and not guard.started:
            await guard.refuse(scope)


class _Guard:
    """Counts the body as the app reads it; once over the limit, answers 413 instead."""

    def __init__(self, receive: Receive, send: Send, max_bytes: int, setting: str) -> None:
        self._receive = receive
        self._send = send
        self._max_bytes = max_bytes
        self._setting = setting
        self._received = 0
        self.exceeded = False
        self.started = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._max_bytes:
                self.exceeded = True
                raise BodyTooLarge
        return message

    async def send(self, message: Message) -> None:
        if self.exceeded and not self.started:
            return  # the app's answer to the failed read; `refuse` sends the 413
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def refuse(self, scope: Scope) -> None:
        self.started = True
        error = PayloadTooLarge(
            f"the request body exceeds the limit of {self._max_bytes} bytes ({self._setting})"
        )
        await respond(scope, error)(scope, self._receive, self._send)


_BODILESS_METHODS = frozenset({"GET", "HEAD"})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
