"""Oldest-first truncation of a chat over the context window (`TOKENRELAY_TRUNCATE_MESSAGES`)."""

from __future__ import annotations

from tokenrelay.shared.generation import ChatMessage
from tokenrelay.shared.truncation import always_kept, truncate_oldest


def chat(*turns: tuple[str, str]) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage(role=role, content=content) for role, content in turns)  # type: ignore[arg-type]


def encode(messages: tuple[ChatMessage, ...]) -> list[int]:
    """One token per character, two per turn for the template."""
    return [0] * sum(len(m.content) + 2 for m in messages)


HISTORY = chat(
    ("system", "be brief"),
    ("user", "first question"),
    ("assistant", "first answer"),
    ("user", "second question"),
    ("assistant", "second answer"),
    ("user", "last"),
)


def test_oldest_turns_go_first_and_system_and_last_stay() -> None:
    full = len(encode(HISTORY))
    kept, ids = truncate_oldest(HISTORY, encode, lambda count: count <= full - 20)
    assert [m.content for m in kept] == [
        "be brief",
        "second question",
        "second answer",
        "last",
    ]
    assert len(ids) == len(encode(kept)) <= full - 20


def test_a_chat_that_fits_is_left_alone() -> None:
    kept, ids = truncate_oldest(HISTORY, encode, lambda count: True)
    assert kept == HISTORY
    assert ids == encode(HISTORY)


def test_when_even_the_kept_turns_do_not_fit_they_are_returned_too_long() -> None:
    kept, ids = truncate_oldest(HISTORY, encode, lambda count: count <= 1)
    assert kept == always_kept(HISTORY)
    assert [m.content for m in kept] == ["be brief", "last"]
    assert len(ids) > 1
