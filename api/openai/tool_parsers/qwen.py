"""Qwen's tool-call format (`qwen`, which vLLM calls `hermes`), whole or as it streams.

Qwen2's chat template asks the model for each call as
`<tool_call>{"name": "...", "arguments": {...}}</tool_call>` (newlines around the JSON
allowed), and `QwenToolCalls` turns the text into OpenAI's pieces: content outside the
calls, and for each call a start (index, id, function name) followed by fragments of its
`arguments` text as they arrive. Text that could still become `<tool_call>` is held back,
and so is each `}` of the arguments until more text shows it is not the call's closing
brace. A call whose text is not that object is given back as content, as vLLM's Hermes
parser does; one cut short by `max_tokens` keeps the arguments it had. Without
`parallel_tool_calls`, everything after the first call is dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from tokenrelay.api.openai.tool_parsers.pieces import (
    Arguments,
    CallStart,
    Content,
    Piece,
    new_call_id,
)
from tokenrelay.shared.generation import ToolCall

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
#: The start of a call, up to its arguments' first character, in the order Qwen2's template
#: shows.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*(?=\S)')


@dataclass
class _Call:
    id: str
    name: str | None = None
    #: Where the arguments start in the call's text, once its head was read.
    arguments_at: int = 0
    #: The arguments text sent so far.
    arguments: str = ""


@dataclass
class QwenToolCalls:
    parallel: bool = True
    calls: list[ToolCall] = field(default_factory=list)
    _buffer: str = ""
    _call: _Call | None = None
    _closed: bool = False

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes (possibly none: held back until more arrives)."""
        self._buffer += text
        pieces: list[Piece] = []
        while not self._closed:
            if self._call is None:
                if not self._read_content(pieces):
                    break
            elif not self._read_call(pieces, self._call):
                break
        return pieces

    def finish(self) -> list[Piece]:
        """The pieces held back at the end of the reply."""
        pieces: list[Piece] = []
        call, rest, self._buffer = self._call, self._buffer, ""
        if self._closed:
            return pieces
        if call is None:
            self._content(pieces, rest)
        elif call.name is None:
            self._content(pieces, OPEN + rest)
        else:
            self._send(pieces, call, rest[call.arguments_at :])
            self._end_call(call)
        return pieces

    def _read_content(self, pieces: list[Piece]) -> bool:
        at = self._buffer.find(OPEN)
        if at < 0:
            keep = _partial_suffix(self._buffer, OPEN)
            self._content(pieces, self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        self._content(pieces, self._buffer[:at])
        self._buffer = self._buffer[at + len(OPEN) :]
        self._call = _Call(id=new_call_id())
        return True

    def _read_call(self, pieces: list[Piece], call: _Call) -> bool:
        end = self._buffer.find(CLOSE)
        body = self._buffer if end < 0 else self._buffer[:end]
        if call.name is None and (head := _HEAD.match(body)):
            call.name, call.arguments_at = head.group(1), head.end()
            pieces.append(CallStart(len(self.calls), call.id, call.name))
        if end < 0:
            if call.name is not None:
                arguments = body[call.arguments_at :]
                brace = arguments.rfind("}")
                self._send(pieces, call, (arguments if brace < 0 else arguments[:brace]).rstrip())
            return False
        self._buffer = self._buffer[end + len(CLOSE) :]
        self._close_call(pieces, call, body)
        return True

    def _close_call(self, pieces: list[Piece], call: _Call, body: str) -> None:
        parsed = _call_object(body)
        if call.name is not None:
            arguments = body[call.arguments_at :].rstrip()
            self._send(pieces, call, arguments.removesuffix("}").rstrip())
        elif parsed is not None:
            call.name = parsed[0]
            pieces.append(CallStart(len(self.calls), call.id, call.name))
            self._send(pieces, call, parsed[1])
        else:
            self._call = None
            self._content(pieces, OPEN + body + CLOSE)
            return
        self._end_call(call)

    def _send(self, pieces: list[Piece], call: _Call, arguments: str) -> None:
        """Send what the arguments text so far (`call.arguments` and more) adds."""
        if len(arguments) > len(call.arguments):
            pieces.append(Arguments(len(self.calls), arguments[len(call.arguments) :]))
            call.arguments = arguments

    def _end_call(self, call: _Call) -> None:
        self.calls.append(ToolCall(id=call.id, name=call.name or "", arguments=call.arguments))
        self._call = None
        self._closed = not self.parallel

    def _content(self, pieces: list[Piece], text: str) -> None:
        if text and not (self.calls and text.isspace()):
            pieces.append(Content(text))


def _call_object(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a call's text when it is `{"name": ..., "arguments": ...}`."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
        return None
    arguments = value.get("arguments", {})
    return value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments)


def _partial_suffix(text: str, token: str) -> int:
    """The length of the longest end of `text` that `token` starts with."""
    for size in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-size:]):
            return size
    return 0
