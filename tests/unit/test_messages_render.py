"""`api.anthropic.render`: the exact bytes of Anthropic's stream events over the one relay, and
the whole `Message` of a reply, text or tool calls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.api.anthropic.render import MessageSSE, message_of
from tokenrelay.api.openai.tool_calls import ToolCallParser
from tokenrelay.api.streaming.hub import Delivery, Heartbeat, StreamItem
from tokenrelay.api.streaming.relay import Collected, relay
from tokenrelay.shared.errors import RedisUnavailable
from tokenrelay.shared.events import Done, Error, Started, TokenChunk, Usage

USAGE = Usage(prompt_tokens=12, completion_tokens=3, total_tokens=15, cached_tokens=4)
START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_j1",'
    b'"type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":0,'
    b'"cache_read_input_tokens":0}}}\n\n'
    b'event: ping\ndata: {"type":"ping"}\n\n'
)


def deliveries(*events: Any) -> list[StreamItem]:
    return [Delivery(event, event.model_dump_json()) for event in events]


async def _items(items: list[StreamItem]) -> AsyncIterator[StreamItem]:
    for item in items:
        yield item


def stream(items: list[StreamItem], parser: ToolCallParser | None = None) -> bytes:
    async def run() -> bytes:
        render = MessageSSE("j1", "m", parser)
        return b"".join([out async for out in relay(_items(items), render)])

    return asyncio.run(run())


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event, as the anthropic SDK reads them."""
    out = []
    for frame in raw.decode().split("\n\n")[:-1]:
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_text_stream_is_exactly_anthropics_event_sequence() -> None:
    raw = stream(
        deliveries(
            Started(seq=0, worker="w", prompt_tokens=12),
            TokenChunk(seq=1, text="Hel", tokens=1),
            TokenChunk(seq=2, text='lo "é"\n', tokens=2),
            Done(seq=3, finish_reason="stop", usage=USAGE, stop_sequence="END"),
        )
    )
    assert raw == START + (
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Hel"}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"lo \\"\xc3\xa9\\"\\n"}}\n\n'
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        b'"stop_sequence","stop_sequence":"END"},"usage":{"input_tokens":8,"output_tokens":3,'
        b'"cache_read_input_tokens":4}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_a_heartbeat_is_a_ping_and_a_reply_cut_short_is_max_tokens() -> None:
    raw = stream(
        [
            Heartbeat(),
            *deliveries(
                Started(seq=0, worker="w", prompt_tokens=12),
                Done(seq=1, finish_reason="length", usage=USAGE),
            ),
        ]
    )
    names = [name for name, _ in events(raw)]
    assert names == ["ping", "message_start", "ping", "message_delta", "message_stop"]
    assert events(raw)[3][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def test_a_second_start_of_a_continued_job_is_not_a_second_message_start() -> None:
    raw = stream(
        deliveries(
            Started(seq=0, worker="w1", prompt_tokens=12),
            TokenChunk(seq=1, text="a", tokens=1),
            Started(seq=2, worker="w2", prompt_tokens=12, attempt=2),
            TokenChunk(seq=3, text="b", tokens=1),
            Done(seq=4, finish_reason="stop", usage=USAGE),
        )
    )
    names = [name for name, _ in events(raw)]
    assert names.count("message_start") == 1
    texts = [data["delta"]["text"] for name, data in events(raw) if name == "content_block_delta"]
    assert texts == ["a", "b"]
    assert events(raw)[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_tool_calls_stream_as_tool_use_blocks_with_input_json_deltas() -> None:
    text = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    chunks = [text[i : i + 7] for i in range(0, len(text), 7)]
    raw = stream(
        deliveries(
            Started(seq=0, worker="w", prompt_tokens=12),
            *[TokenChunk(seq=i + 1, text=c, tokens=1) for i, c in enumerate(chunks)],
            Done(seq=len(chunks) + 1, finish_reason="stop", usage=USAGE),
        ),
        ToolCallParser(),
    )
    seen = events(raw)
    starts = [data["content_block"] for name, data in seen if name == "content_block_start"]
    assert starts[0] == {"type": "text", "text": ""}
    assert starts[1]["type"] == "tool_use"
    assert starts[1]["name"] == "get_weather"
    assert starts[1]["input"] == {}
    deltas = [data for name, data in seen if name == "content_block_delta"]
    assert "".join(d["delta"]["text"] for d in deltas if d["index"] == 0) == "Sure."
    partial = "".join(d["delta"]["partial_json"] for d in deltas if d["index"] == 1)
    assert json.loads(partial) == {"city": "Paris"}
    stops = [data["index"] for name, data in seen if name == "content_block_stop"]
    assert stops == [0, 1]
    assert seen[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_an_error_after_the_start_is_anthropics_error_event_and_ends_the_stream() -> None:
    raw = stream(
        deliveries(
            Started(seq=0, worker="w", prompt_tokens=12),
            TokenChunk(seq=1, text="a", tokens=1),
            Error(seq=2, error_type="worker_lost", message="the worker died"),
        )
    )
    assert raw.endswith(
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"the worker died"}}\n\n'
    )
    assert [name for name, _ in events(raw)][-1] == "error"


def test_lost_redis_mid_stream_is_an_error_event() -> None:
    render = MessageSSE("j1", "m", None)
    name, data = events(render.lost_redis())[0]
    assert name == "error"
    assert data["error"]["type"] == "overloaded_error"
    assert RedisUnavailable.status_code == 503  # Anthropic's 529 for every 503


def collected(text: str, finish: Any = "stop", stop: str | None = None) -> Collected:
    return Collected(text, Done(finish_reason=finish, usage=USAGE, stop_sequence=stop), None)


def test_a_whole_message_holds_its_text_usage_and_stop_sequence() -> None:
    message = message_of("j1", "m", collected("Hello", stop="END"), None)
    assert message.model_dump(mode="json") == {
        "id": "msg_j1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
        "usage": {"input_tokens": 8, "output_tokens": 3, "cache_read_input_tokens": 4},
    }
    assert message_of("j1", "m", collected(""), None).content == []


def test_a_whole_message_with_calls_holds_tool_use_blocks() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    message = message_of("j1", "m", collected(text), ToolCallParser())
    assert message.stop_reason == "tool_use"
    assert message.stop_sequence is None
    [use] = message.model_dump()["content"]
    assert (use["type"], use["name"], use["input"]) == (
        "tool_use",
        "get_weather",
        {"city": "Paris"},
    )


def test_a_call_whose_input_is_not_an_object_is_answered_as_the_text_written() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>'
    message = message_of("j1", "m", collected(text), ToolCallParser())
    assert message.stop_reason == "end_turn"
    assert message.model_dump()["content"] == [{"type": "text", "text": text}]
