"""What a tool-call parser makes of a reply's text: OpenAI's pieces (content, the start of
a call, fragments of its `arguments`), and the interface every format's parser has."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Protocol

from tokenrelay.shared.generation import ToolCall


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


Piece = Content | CallStart | Arguments


class CallFormat(Protocol):
    """One tool-call format's parser of one reply, fed its text as it streams (or all at
    once)."""

    #: The calls completed so far.
    calls: list[ToolCall]

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes (possibly none: held back until more arrives)."""

    def finish(self) -> list[Piece]:
        """The pieces held back at the end of the reply."""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"
