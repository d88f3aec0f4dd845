"""SSE bytes, pinned: line breaks of every kind, CJK and emoji survive a spec-following parser."""

from __future__ import annotations

import pytest

from api import sse


def parse_data(raw: bytes) -> str:
    """What a spec-following client reconstructs: `data:` lines joined with '\\n'."""
    lines = raw.decode().removesuffix("\n\n").split("\n")
    return "\n".join(line.removeprefix("data: ") for line in lines if line.startswith("data: "))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("hello", b"data: hello\n\n"),
        ("a\nb", b"data: a\ndata: b\n\n"),
        ("a\r\nb", b"data: a\ndata: b\n\n"),
        ("a\rb", b"data: a\ndata: b\n\n"),
        ("\n", b"data: \ndata: \n\n"),
        ("你好🚀", "data: 你好🚀\n\n".encode()),
        ('{"text": "x\\ny"}', b'data: {"text": "x\\ny"}\n\n'),
    ],
)
def test_data_lines(data: str, expected: bytes) -> None:
    assert sse.encode(data) == expected


@pytest.mark.parametrize("text", ["line1\nline2", "crlf\r\nend", "汉字\n\n🚀 emoji", "\ttab\n"])
def test_round_trip_keeps_text_up_to_line_break_normalisation(text: str) -> None:
    normalised = text.replace("\r\n", "\n").replace("\r", "\n")
    assert parse_data(sse.encode(text)) == normalised


def test_id_and_event_fields_come_first() -> None:
    assert sse.encode("x", event="token", event_id=7) == b"id: 7\nevent: token\ndata: x\n\n"


def test_comment_is_ignored_by_clients() -> None:
    assert sse.comment() == b": ping\n\n"
