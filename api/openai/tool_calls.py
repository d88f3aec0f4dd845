"""Tool calls out of a reply's text, whole or as it streams, in the format of the model that
wrote it: the tool-call parser is a named choice per model, as vLLM's `--tool-call-parser`
is (`TOKENRELAY_TOOL_CALL_PARSER`, published by the model's workers, shown in `/v1/models`).

- `qwen` (vLLM's `hermes`; the default): calls inside `<tool_call>` tags, as Qwen2's chat
  template asks (`tool_parsers.qwen`).
- `json`: a reply that is exactly one JSON call, bare or in a ```json block, naming an
  offered function (`tool_parsers.json_reply`), as Qwen2.5-Coder-0.5B-Instruct writes them.

A format is never guessed from the text: a reply in another format is content.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenrelay.api.openai.tool_parsers.json_reply import JsonReplyToolCalls
from tokenrelay.api.openai.tool_parsers.pieces import (
    Arguments,
    CallFormat,
    CallStart,
    Content,
    Piece,
)
from tokenrelay.api.openai.tool_parsers.qwen import QwenToolCalls
from tokenrelay.shared.generation import ToolCall
from tokenrelay.shared.settings import ToolCallParserName

__all__ = ["Arguments", "CallStart", "Content", "Piece", "ToolCallParser", "parse_reply"]


class ToolCallParser:
    """One reply's parser in the format `name`; `functions` are the offered ones (the `json`
    format takes only a call of one of them). Without `parallel`, the `qwen` format drops
    everything after the first call (the `json` one reads one call at most)."""

    def __init__(
        self,
        parallel: bool = True,
        *,
        name: ToolCallParserName = "qwen",
        functions: Iterable[str] = (),
    ) -> None:
        self.parallel = parallel
        self.name = name
        self._format: CallFormat = (
            JsonReplyToolCalls(frozenset(functions)) if name == "json" else QwenToolCalls(parallel)
        )

    @property
    def calls(self) -> list[ToolCall]:
        """The calls completed so far."""
        return self._format.calls

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes (possibly none: held back until more arrives)."""
        return self._format.feed(text)

    def finish(self) -> list[Piece]:
        """The pieces held back at the end of the reply."""
        return self._format.finish()


def parse_reply(text: str, parser: ToolCallParser) -> tuple[str | None, list[ToolCall]]:
    """A whole reply's content (None when it is only tool calls) and its tool calls, read by
    `parser` (a new one: it reads one reply)."""
    pieces = parser.feed(text) + parser.finish()
    content = "".join(piece.text for piece in pieces if isinstance(piece, Content))
    if parser.calls and not content.strip():
        return None, parser.calls
    return content, parser.calls
