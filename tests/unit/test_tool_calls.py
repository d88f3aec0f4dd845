"""The `qwen` tool-call parser (`<tool_call>` tags) on its own: the same calls whole and
streamed in any slicing, content around them, held-back prefixes, calls that are not calls,
cut-short calls; `hermes` is the same parser."""

from __future__ import annotations

from typing import Literal

import pytest

from tokenrelay.api.openai.tool_calls import (
    Arguments,
    CallStart,
    Content,
    ToolCallParser,
    parse_reply,
)

REPLY = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Par}is", "n": {"x": 1}}}\n'
    "</tool_call>\n<tool_call>"
    '{"name": "get_time", "arguments": {}}</tool_call>'
)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 11, len(REPLY)])
def test_streamed_pieces_add_up_to_the_whole_replys_calls(step: int) -> None:
    parser = ToolCallParser()
    pieces = []
    for at in range(0, len(REPLY), step):
        pieces += parser.feed(REPLY[at : at + step])
    pieces += parser.finish()
    assert "".join(p.text for p in pieces if isinstance(p, Content)) == "Let me check.\n"
    starts = [p for p in pieces if isinstance(p, CallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_time")]
    arguments = ["", ""]
    for piece in pieces:
        if isinstance(piece, Arguments):
            arguments[piece.index] += piece.text
    assert arguments == ['{"city": "Par}is", "n": {"x": 1}}', "{}"]
    content, calls = parse_reply(REPLY, ToolCallParser())
    assert content == "Let me check.\n"
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", arguments[0]),
        ("get_time", "{}"),
    ]
    assert [c.id for c in parser.calls] == [s.id for s in starts]


def test_without_parallel_calls_only_the_first_is_kept() -> None:
    _, calls = parse_reply(REPLY, ToolCallParser(parallel=False))
    assert [c.name for c in calls] == ["get_weather"]


def test_text_that_only_looks_like_a_call_start_is_content() -> None:
    assert parse_reply("a <tool text", ToolCallParser()) == ("a <tool text", [])
    parser = ToolCallParser()
    assert parser.feed("x <tool_") == [Content("x ")]
    assert parser.feed("cal") == []
    assert parser.finish() == [Content("<tool_cal")]


def test_a_call_that_is_not_a_call_object_is_given_back_as_content() -> None:
    text = "a<tool_call>not json</tool_call>b"
    assert parse_reply(text, ToolCallParser()) == (text, [])


def test_a_call_with_its_keys_in_another_order_is_still_a_call() -> None:
    text = '<tool_call>{"arguments": {"q": 1}, "name": "z"}</tool_call>'
    content, calls = parse_reply(text, ToolCallParser())
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [("z", '{"q": 1}')]


def test_a_call_cut_short_keeps_the_arguments_it_had() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"q": "ab'
    content, calls = parse_reply(text, ToolCallParser())
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"q": "ab')]


@pytest.mark.parametrize("name", ["qwen", "hermes"])
def test_qwen_and_hermes_name_the_tag_parser_and_neither_reads_a_bare_json_call(
    name: Literal["qwen", "hermes"],
) -> None:
    parser = ToolCallParser(name=name, functions=["get_time"])
    assert parse_reply(REPLY, parser)[1][1].name == "get_time"
    bare = '{"name": "get_time", "arguments": {}}'
    assert parse_reply(bare, ToolCallParser(name=name, functions=["get_time"])) == (bare, [])
