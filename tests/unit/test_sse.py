"""SSE bytes, pinned: line breaks of every kind, CJK and emoji survive a spec-following parser."""

from __future__ import annotations

import json

import pytest

from tokenrelay.api.openai.schema import ChatCompletionChunk, ChunkChoice, Delta
from tokenrelay.api.streaming import sse


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


TRICKY_TEXTS = [
    "",
    "plain",
    'quote " and \\ backslash',
    "line\nbreak\r\n",
    "\x00\x1f ctl",
    "🚀 你好",
    "\u2028\u0085\ue000",
]


def test_text_frames_render_once_and_carry_the_same_json_as_the_model() -> None:
    renders: list[str] = []

    def render(value: str) -> str:
        renders.append(value)
        chunk = ChatCompletionChunk(
            id="chatcmpl-x", created=1, model="m", choices=[ChunkChoice(delta=Delta(content=value))]
        )
        return chunk.model_dump_json()

    frames = sse.TextFrames(render)
    for text in TRICKY_TEXTS:
        frame = frames.frame(text)
        assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
        assert frame.count(b"\n") == 2, "one data line: JSON escapes line breaks"
        assert json.loads(frame[len(b"data: ") : -2]) == json.loads(render(text))
    assert len(renders) == 1 + len(TRICKY_TEXTS), "one template render; the rest by the test"


def test_text_frames_render_every_frame_where_the_template_has_no_single_slot() -> None:
    def twice(value: str) -> str:
        return json.dumps({"a": value, "b": value})

    assert sse.TextFrames(twice).frame("hi") == sse.encode(twice("hi"))
