"""Stop strings cut the text exactly, across chunk boundaries, and never leak a prefix."""

from __future__ import annotations

import pytest

from tokenrelay.worker.stop_strings import StopStringMatcher


def run(stops: list[str], chunks: list[str]) -> tuple[list[str], bool]:
    matcher = StopStringMatcher(stops)
    sent = [matcher.feed(chunk) for chunk in chunks]
    sent.append(matcher.flush())
    return sent, matcher.stopped


@pytest.mark.parametrize(
    ("stops", "chunks", "expected_text", "stopped"),
    [
        ([], ["a", "b\n", "c"], "ab\nc", False),
        (["END"], ["hello E", "N", "D more"], "hello ", True),
        (["END"], ["hello E", "N", "x"], "hello ENx", False),
        (["\n\n"], ["line\n", "\nnext"], "line", True),
        (["停"], ["你好", "停下"], "你好", True),
        (["Observation:"], ["Thought: go", "\nObs", "ervation: x"], "Thought: go\n", True),
        (["ab", "b"], ["xa", "b"], "x", True),
    ],
)
def test_text_is_cut_at_the_first_stop_string(
    stops: list[str], chunks: list[str], expected_text: str, stopped: bool
) -> None:
    sent, was_stopped = run(stops, chunks)
    assert "".join(sent) == expected_text
    assert was_stopped is stopped


def test_a_possible_stop_prefix_is_held_back_until_resolved() -> None:
    matcher = StopStringMatcher(["END"])
    assert matcher.feed("abc EN") == "abc "
    assert matcher.feed("Z") == "ENZ"


def test_the_stop_string_itself_is_kept_when_asked() -> None:
    matcher = StopStringMatcher(["Observation:"], include_stop=True)
    sent = matcher.feed("Thought: go\nObserv") + matcher.feed("ation: x")
    assert sent == "Thought: go\nObservation:"
    assert matcher.stopped


@pytest.mark.parametrize(
    ("stops", "chunks", "matched"),
    [
        (["END", "\n"], ["a\nb END"], "\n"),
        (["END", "\n"], ["a E", "ND\n"], "END"),
        (["ab", "b"], ["xa", "b"], "ab"),
        (["END"], ["no stop here"], None),
    ],
)
def test_the_stop_string_that_ended_the_text_is_named(
    stops: list[str], chunks: list[str], matched: str | None
) -> None:
    """Anthropic's Messages API reports it as `stop_sequence`."""
    matcher = StopStringMatcher(stops)
    for chunk in chunks:
        matcher.feed(chunk)
    assert matcher.matched == matched
