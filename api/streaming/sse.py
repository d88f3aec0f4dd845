"""Server-sent events on the wire, and the response that carries them.

`encode` follows the HTML spec: a payload's line breaks (`\r\n`, `\r`, `\n`) become
separate `data:` lines, which a client joins back with `\n`. JSON payloads never contain raw
line breaks; plain-text payloads keep their newlines this way instead of being mangled.

HOT PATH (docs/architecture.md, "The per-token path"): measure with `python -m bench.gateway`
before and after changing it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable

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


#: Stands for the text while a `TextFrames` template is rendered (private-use characters).
_TEXT_MARK = "\ue000tokenrelay-text\ue000"


class TextFrames:
    """The `data:` frames of one JSON document that differ per token only in one string.

    `render(text)` gives the document's JSON; it runs once, with a marker for the text, and
    each token's frame is then the bytes around the marker with `json.dumps(text)` in
    between, a small fraction of a pydantic model serialised per token
    (docs/benchmarks/gateway.md). Where the marker does not appear exactly once
    in the template, every frame is rendered.
    """

    def __init__(self, render: Callable[[str], str]) -> None:
        self._render = render
        parts = render(_TEXT_MARK).split(json.dumps(_TEXT_MARK, ensure_ascii=False))
        self._around = (
            (f"data: {parts[0]}".encode(), f"{parts[1]}\n\n".encode()) if len(parts) == 2 else None
        )

    def frame(self, text: str) -> bytes:
        if self._around is None:
            return encode(self._render(text))
        head, tail = self._around
        return head + json.dumps(text, ensure_ascii=False).encode() + tail


def comment(text: str = "ping") -> bytes:
    return f": {text}\n\n".encode()


def response(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)
