"""Oldest-first truncation of a chat over the context window (`TOKENRELAY_TRUNCATE_MESSAGES`).

The second article trims its `history` this way. The system turns and the last message are
always kept; the other turns are dropped oldest first, one at a time, until the prompt fits.
Both sides use it: the API counts only what is always kept at admission, and the worker
drops turns until its exact count fits.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenrelay.shared.generation import ChatMessage


def always_kept(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    """The turns truncation never drops: every system turn and the last message."""
    last = len(messages) - 1
    return tuple(m for i, m in enumerate(messages) if m.role == "system" or i == last)


def truncate_oldest(
    messages: tuple[ChatMessage, ...],
    encode: Callable[[tuple[ChatMessage, ...]], list[int]],
    fits: Callable[[int], bool],
) -> tuple[tuple[ChatMessage, ...], list[int]]:
    """Drop droppable turns oldest first until `fits(len(encode(kept)))`; returns the kept
    turns and their ids (still too long when what is always kept does not fit)."""
    kept = messages
    ids = encode(kept)
    while not fits(len(ids)):
        droppable = [i for i, m in enumerate(kept) if m.role != "system" and i != len(kept) - 1]
        if not droppable:
            break
        kept = kept[: droppable[0]] + kept[droppable[0] + 1 :]
        ids = encode(kept)
    return kept, ids
