"""The `json` tool-call parser on its own: a reply that is exactly one JSON call of an offered
function, bare or fenced, is a call whole and streamed in any slicing; anything else is
content, unchanged; a reply that cannot be a call streams from its first piece, one that
could is held back only until it cannot."""

from __future__ import annotations

import json

import pytest

from tokenrelay.api.openai.tool_calls import (
    Arguments,
    CallStart,
    Content,
    Piece,
    ToolCallParser,
    parse_reply,
)

FUNCTIONS = ["get_weather", "get_time"]
CALL = '{"name": "get_weather", "arguments": {"city": "Par}is", "days": {"n": 2}}}'
ARGUMENTS = {"city": "Par}is", "days": {"n": 2}}
CALLS = [
    CALL,
    f"  \n{CALL}\n",
    f"```json\n{CALL}\n```",
    f"```\n{CALL}\n```\n",
    f'```json\n{{"name": "get_weather", "arguments": {json.dumps(json.dumps(ARGUMENTS))}}}\n```',
]
NOT_CALLS = [
    "The weather in Paris is sunny.",
    f"Sure: {CALL}",
    f"{CALL} Let me know.",
    f"{CALL}\n{CALL}",
    '{"name": "get_news", "arguments": {}}',
    '{"name": "get_weather", "arguments": {}, "id": 1}',
    '{"name": "get_weather", "arguments": [1]}',
    '{"name": "get_weather", "arguments": "not json"}',
    '{"name": ["get_weather"], "arguments": {}}',
    '{"city": "Paris"}',
    f"```python\n{CALL}\n```",
    f"```json\n{CALL}\n``` and more",
    f"```json\n{CALL}",
    '{"name": "get_weather", "arguments": {"city": "Par',
]


def parser() -> ToolCallParser:
    return ToolCallParser(name="json", functions=FUNCTIONS)


def streamed(text: str, step: int) -> tuple[list[Piece], ToolCallParser]:
    reader = parser()
    pieces = []
    for at in range(0, len(text), step):
        pieces += reader.feed(text[at : at + step])
    return pieces + reader.finish(), reader


@pytest.mark.parametrize("reply", CALLS)
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_a_reply_that_is_one_call_is_that_call_in_any_slicing(reply: str, step: int) -> None:
    pieces, reader = streamed(reply, step)
    (start, arguments) = pieces
    assert isinstance(start, CallStart)
    assert (start.index, start.name) == (0, "get_weather")
    assert isinstance(arguments, Arguments)
    assert json.loads(arguments.text) == ARGUMENTS
    assert [(c.id, c.name, c.arguments) for c in reader.calls] == [
        (start.id, "get_weather", arguments.text)
    ]
    content, calls = parse_reply(reply, parser())
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGUMENTS)]


@pytest.mark.parametrize("reply", NOT_CALLS)
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_any_other_reply_is_content_unchanged(reply: str, step: int) -> None:
    pieces, reader = streamed(reply, step)
    assert all(isinstance(piece, Content) for piece in pieces)
    assert "".join(piece.text for piece in pieces if isinstance(piece, Content)) == reply
    assert reader.calls == []
    assert parse_reply(reply, parser()) == (reply, [])


def test_a_reply_that_cannot_be_a_call_streams_from_its_first_piece() -> None:
    reader = parser()
    assert reader.feed("  ") == []
    assert reader.feed("The") == [Content("  The")]
    assert reader.feed(" weather") == [Content(" weather")]
    assert reader.finish() == []


def test_a_fence_of_another_language_is_let_go_as_soon_as_it_shows() -> None:
    reader = parser()
    assert reader.feed("```") == []
    assert reader.feed("py") == [Content("```py")]


def test_an_object_that_is_no_call_is_let_go_when_it_closes() -> None:
    reader = parser()
    assert reader.feed('{"city": "Paris"') == []
    assert reader.feed("}") == [Content('{"city": "Paris"}')]
    assert reader.feed(" is the answer") == [Content(" is the answer")]


def test_a_call_is_held_until_the_reply_ends_as_text_may_follow_it() -> None:
    reader = parser()
    assert reader.feed(CALL) == []
    assert reader.feed("\n") == []
    assert reader.feed("Done") == [Content(f"{CALL}\nDone")]


def test_only_an_offered_function_makes_a_call() -> None:
    reader = ToolCallParser(name="json", functions=["get_time"])
    assert parse_reply(CALL, reader) == (CALL, [])
