"""The `json` tool-call format: a reply that is exactly one JSON call, for models that write
their calls without Qwen's `<tool_call>` tags (Qwen2.5-Coder-0.5B-Instruct, the demo's).

A reply is a call when, leading and trailing whitespace aside, it is one JSON object
`{"name": ..., "arguments": {...}}` (those two keys, `arguments` an object or the JSON text
of one), bare or alone in a ```` ```json ```` (or plain ```` ``` ````) fenced block, and
`name` is one of the offered functions. Anything else is content, unchanged: text around
the object, a second object, an unknown function.

Streaming: whether a reply is a call is known only at its end (text may follow the object),
so a reply that could still be one is held back: one whose first non-blank text is `{` or
the start of a fence. Anything else streams as content from its first token on. A held
reply is let go as content as soon as it cannot be a call any more (each time the text so
far completes a JSON object, that object is checked); otherwise at the end it comes out
whole, as one call (its `arguments` in one fragment) or as content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tokenrelay.api.openai.tool_parsers.pieces import (
    Arguments,
    CallStart,
    Content,
    Piece,
    new_call_id,
)
from tokenrelay.shared.generation import ToolCall

FENCES = ("```json", "```")
#: A fence's opening line, up to the object.
_OPENING_FENCE = re.compile(r"```(?:json)?[ \t]*\n?\s*")
_DECODER = json.JSONDecoder()


@dataclass
class JsonReplyToolCalls:
    functions: frozenset[str]
    calls: list[ToolCall] = field(default_factory=list)
    _held: str = ""
    #: Once the held text holds a whole call object: what follows it is checked too.
    _closed: bool = False
    #: Once the reply cannot be a call: its text goes out as it comes.
    _passing: bool = False

    def feed(self, text: str) -> list[Piece]:
        if self._passing:
            return [Content(text)] if text else []
        self._held += text
        start = self._held.lstrip()
        if not start:
            return []
        checks_object = self._closed or "}" in text
        if not _may_open(start) or (checks_object and not self._may_be_call(start)):
            return self._let_go()
        return []

    def finish(self) -> list[Piece]:
        if self._passing or not self._held:
            return []
        call = _call_of(self._held.strip(), self.functions)
        if call is None:
            return self._let_go()
        name, arguments = call
        self.calls.append(ToolCall(id=new_call_id(), name=name, arguments=arguments))
        self._held = ""
        return [CallStart(0, self.calls[0].id, name), Arguments(0, arguments)]

    def _let_go(self) -> list[Piece]:
        self._passing = True
        held, self._held = self._held, ""
        return [Content(held)]

    def _may_be_call(self, start: str) -> bool:
        """False once the text so far holds a whole JSON object that is no call, or text
        after it that no call has."""
        body, fenced = _unfenced(start)
        try:
            value, end = _DECODER.raw_decode(body)
        except ValueError:
            return True  # not a whole object yet
        self._closed = True
        return _as_call(value, self.functions) is not None and _may_end(
            body[end:], fenced, complete=False
        )


def _may_open(start: str) -> bool:
    """Whether a reply beginning with `start` (not blank) may still be a call."""
    if start.startswith("{"):
        return True
    for fence in FENCES:
        if fence.startswith(start):
            return True
        if start.startswith(fence):
            after = start[len(fence) :].lstrip()
            return not after or after.startswith("{")
    return False


def _unfenced(start: str) -> tuple[str, bool]:
    """The text from the object on, and whether a fence opened it."""
    if start.startswith("{"):
        return start, False
    opening = _OPENING_FENCE.match(start)
    return (start[opening.end() :] if opening else start), True


def _may_end(rest: str, fenced: bool, *, complete: bool) -> bool:
    """Whether `rest`, what follows the object, ends a call: whitespace, and after a fenced
    object its closing fence; before the reply's end (not `complete`), a closing fence may
    still be on its way."""
    tail = rest.strip()
    if not fenced:
        return not tail
    return tail == "```" if complete else "```".startswith(tail)


def _call_of(reply: str, functions: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) when the whole reply is one call of one of `functions`."""
    body, fenced = _unfenced(reply)
    try:
        value, end = _DECODER.raw_decode(body)
    except ValueError:
        return None
    if not _may_end(body[end:], fenced, complete=True):
        return None
    return _as_call(value, functions)


def _as_call(value: Any, functions: frozenset[str]) -> tuple[str, str] | None:
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or name not in functions:
        return None
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
    elif isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    else:
        return None
    return name, arguments
