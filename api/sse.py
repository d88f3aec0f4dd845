"""Server-sent events on the wire, and the response that carries them.

`encode` follows the HTML spec: a payload's line breaks (`\r\n`, `\r`, `\n`) become
separate `data:` lines, which a client joins back with `\n`. JSON payloads never contain raw
line breaks; plain-text payloads keep their newlines this way instead of being mangled.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse

_LINE_BREAK = re.compile(r"\r\n|\r|\n")

SSE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}


def encode(data: str, *, event: str | None = None, event_id: int | None = None) -> bytes:
    lines: list[str] = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.extend(f"data: {line}" for line in _LINE_BREAK.split(data))
    return ("\n".join(lines) + "\n\n").encode()


def comment(text: str = "ping") -> bytes:
    return f": {text}\n\n".encode()


def response(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)
