"""Cut generated text at the first stop string, never streaming part of one.

Text that could still turn into a stop string is held back until it cannot; the client
never sees a stop string or a prefix of one that was about to become it, unless the
request asks for the stop string in the output (`include_stop_str_in_output`, as vLLM;
the second article's `user_stop_words` work that way).

HOT PATH (docs/architecture.md, "The per-token path"): measure with
`python -m bench.worker_throughput` before and after changing it.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stops: Sequence[str], *, include_stop: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include_stop = include_stop
        self._held = ""
        self.stopped = False
        #: The stop string that ended the text (the earliest in it), once `stopped`.
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add newly decoded text; return what is safe to send now.

        After a stop string is found, `stopped` is True and the text before it is returned.
        """
        if self.stopped:
            return ""
        pending = self._held + text
        found = [(i, i + len(s), s) for s in self._stops if (i := pending.find(s)) >= 0]
        if found:
            start, end, self.matched = min(found)
            self.stopped = True
            self._held = ""
            return pending[: end if self._include_stop else start]
        keep = self._longest_stop_prefix_suffix(pending)
        self._held = pending[len(pending) - keep :]
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """Text still held back when generation ended without a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:size]):
                    best = size
                    break
        return best
