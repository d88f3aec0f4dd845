"""A job's reply in Anthropic's shapes: the events of a streamed message (`MessageSSE`, a
renderer on the one relay) and the whole `Message` of one that is not (`message_of`).

The stream: `message_start` (when the worker starts the job, with the prompt's tokens),
`ping`, then per content block `content_block_start`, its `content_block_delta`s
(`text_delta`, or `input_json_delta` fragments of a tool call's input as the model writes
them) and `content_block_stop`; then `message_delta` (`stop_reason`, `stop_sequence`, the
usage) and `message_stop`. A `ping` event stands for each heartbeat; an error after the
start arrives as Anthropic's `error` event, and the stream ends there. With tools, the
chat path's parser (`api.openai.tool_calls`) cuts the text into content and calls.

HOT PATH (docs/architecture.md, "The per-token path"): a text token is one
`sse.TextFrames` frame behind a fixed `event:` line; measure with `python -m bench.gateway
--api chat,messages` before and after changing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tokenrelay.api.anthropic import errors
from tokenrelay.api.anthropic.message import (
    Message,
    MessageUsage,
    TextContent,
    ToolUseContent,
    stop_reason,
    stop_sequence,
)
from tokenrelay.api.openai.tool_calls import (
    Arguments,
    CallStart,
    Content,
    Piece,
    ToolCallParser,
    parse_reply,
)
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.hub import Delivery
from tokenrelay.api.streaming.relay import Collected, GenerationRenderer
from tokenrelay.shared.errors import TokenrelayError
from tokenrelay.shared.events import Done, Started

_DELTA_LINE = b"event: content_block_delta\n"
_PING = sse.encode('{"type":"ping"}', event="ping")
_STOP = sse.encode('{"type":"message_stop"}', event="message_stop")


def message_id(job_id: str) -> str:
    return f"msg_{job_id}"


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return sse.encode(_json({"type": kind, **payload}), event=kind)


class MessageSSE(GenerationRenderer):
    def __init__(self, job_id: str, model: str, parser: ToolCallParser | None) -> None:
        self._id = message_id(job_id)
        self._model = model
        self._parser = parser
        self._started = False
        #: The last content block's index, and whether it is still open.
        self._index = -1
        self._open = False
        #: The frames of the open block's text deltas; None unless a text block is open.
        self._text_frames: sse.TextFrames | None = None

    def event(self, delivery: Delivery) -> bytes | None:
        if isinstance(delivery.event, Started):
            return self._start(delivery.event.prompt_tokens)
        return super().event(delivery)

    def text(self, text: str) -> bytes:
        """The hot path: once per token event of every stream."""
        if self._parser is not None:
            return self._pieces(self._parser.feed(text))
        return self._content(text)

    def done(self, event: Done) -> bytes:
        out = self._start(event.usage.prompt_tokens)
        called = False
        if self._parser is not None:
            out += self._pieces(self._parser.finish())
            called = bool(self._parser.calls)
        out += self._close()
        delta = {
            "stop_reason": stop_reason(event, called),
            "stop_sequence": stop_sequence(event, called),
        }
        usage = MessageUsage.of(event.usage).model_dump()
        return out + _event("message_delta", {"delta": delta, "usage": usage}) + _STOP

    def error(self, exc: TokenrelayError) -> bytes:
        return errors.event(exc)

    def ping(self) -> bytes:
        return _PING

    def end(self) -> None:
        return None

    def _start(self, prompt_tokens: int) -> bytes:
        """`message_start` and a `ping`, once (a continued job starts again, unseen)."""
        if self._started:
            return b""
        self._started = True
        usage = MessageUsage(input_tokens=prompt_tokens, output_tokens=0)
        message = Message(id=self._id, model=self._model, content=[], usage=usage)
        return _event("message_start", {"message": message.model_dump(mode="json")}) + _PING

    def _pieces(self, pieces: list[Piece]) -> bytes:
        out = b""
        for piece in pieces:
            match piece:
                case Content(text=text):
                    out += self._content(text)
                case CallStart(id=call_id, name=name):
                    block = ToolUseContent(id=call_id, name=name, input={})
                    out += self._open_block(block.model_dump())
                case Arguments(text=text):
                    delta = {"type": "input_json_delta", "partial_json": text}
                    out += _event("content_block_delta", {"index": self._index, "delta": delta})
        return out

    def _content(self, text: str) -> bytes:
        frames, out = self._text_frames, b""
        if frames is None:
            out = self._open_block(TextContent(text="").model_dump())
            frames = self._text_frames = sse.TextFrames(_text_delta(self._index))
        return out + _DELTA_LINE + frames.frame(text)

    def _open_block(self, block: dict[str, Any]) -> bytes:
        out = self._start(0) + self._close()
        self._index += 1
        self._open = True
        start = {"index": self._index, "content_block": block}
        return out + _event("content_block_start", start)

    def _close(self) -> bytes:
        if not self._open:
            return b""
        self._open, self._text_frames = False, None
        return _event("content_block_stop", {"index": self._index})


def _text_delta(index: int) -> Callable[[str], str]:
    """The JSON of a text delta of block `index` (`sse.TextFrames` renders it once)."""
    return lambda text: _json(
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        }
    )


def message_of(
    job_id: str, model: str, result: Collected, parser: ToolCallParser | None
) -> Message:
    """The whole reply: its text, and with tools its calls as `tool_use` blocks. A reply
    whose calls do not all carry a JSON object as input is answered as the text the model
    wrote (a `tool_use` block's input is an object)."""
    content: str | None = result.text
    uses: list[ToolUseContent] = []
    if parser is not None:
        content, calls = parse_reply(result.text, parser)
        inputs = [_object(call.arguments) for call in calls]
        if all(value is not None for value in inputs):
            uses = [
                ToolUseContent(id=call.id, name=call.name, input=value)
                for call, value in zip(calls, inputs, strict=True)
                if value is not None
            ]
        else:
            content = result.text
    blocks: list[TextContent | ToolUseContent] = [TextContent(text=content)] if content else []
    done = result.done
    return Message(
        id=message_id(job_id),
        model=model,
        content=[*blocks, *uses],
        stop_reason=stop_reason(done, bool(uses)),
        stop_sequence=stop_sequence(done, bool(uses)),
        usage=MessageUsage.of(done.usage),
    )


def _object(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
