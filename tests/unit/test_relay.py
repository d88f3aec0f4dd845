"""`api.streaming.relay.relay`: the bytes of a stream, in the writes the server makes of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from tokenrelay.api.streaming.hub import Delivery, StreamItem, StreamsClosing
from tokenrelay.api.streaming.relay import relay
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage


class _Render:
    """Each part as its name; a Started event sends nothing, as the real renderers do."""

    def start(self) -> bytes | None:
        return b"[start]"

    def event(self, delivery: Delivery) -> bytes | None:
        event = delivery.event
        if isinstance(event, TokenChunk):
            return f"[{event.text}]".encode()
        return b"[done]" if isinstance(event, Done) else None

    def ping(self) -> bytes | None:
        return b"[ping]"

    def lost_redis(self) -> bytes:
        return b"[lost]"

    def closing(self) -> bytes:
        return b"[closing]"

    def end(self) -> bytes | None:
        return b"[end]"


def _delivery(event: Any) -> Delivery:
    return Delivery(event, event.model_dump_json())


async def _events(items: list[StreamItem]) -> AsyncIterator[StreamItem]:
    for item in items:
        yield item


async def _writes(items: list[StreamItem]) -> list[bytes]:
    return [out async for out in relay(_events(items), _Render())]


def test_the_start_goes_out_with_the_first_token_in_one_write() -> None:
    usage = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    items: list[StreamItem] = [
        _delivery(Started(seq=0, worker="w", prompt_tokens=1)),
        _delivery(TokenChunk(seq=1, text="a", tokens=1)),
        _delivery(TokenChunk(seq=2, text="b", tokens=1)),
        _delivery(Done(seq=3, finish_reason="stop", usage=usage)),
    ]
    writes = asyncio.run(_writes(items))
    assert writes == [b"[start][a]", b"[b]", b"[done]", b"[end]"]


def test_a_stream_without_events_still_sends_its_start_before_its_end() -> None:
    assert asyncio.run(_writes([])) == [b"[start][end]"]


def _tokens(n: int) -> list[StreamItem]:
    return [_delivery(TokenChunk(seq=seq, text="t", tokens=1)) for seq in range(n)]


async def _read(stream: AsyncIterator[bytes], writes: int) -> None:
    """Read `writes` writes of `stream`, then close it, as a server does when its client
    leaves."""
    for _ in range(writes):
        await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]


def test_a_client_that_leaves_before_the_end_runs_on_leave_once() -> None:
    left: list[str] = []
    stream = relay(_events(_tokens(5)), _Render(), on_leave=lambda: left.append("left"))
    asyncio.run(_read(stream, 2))
    assert left == ["left"]


def test_a_stream_read_to_its_end_does_not_run_on_leave() -> None:
    usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    items = [*_tokens(1), _delivery(Done(seq=1, finish_reason="stop", usage=usage))]
    left: list[str] = []

    async def read_all() -> list[bytes]:
        stream = relay(_events(items), _Render(), on_leave=lambda: left.append("left"))
        return [out async for out in stream]

    assert asyncio.run(read_all()) == [b"[start][t]", b"[done]", b"[end]"]
    assert left == []


def test_a_stream_the_process_ends_gets_the_last_word_its_end_and_on_leave() -> None:
    """`StreamHub.close_streams` (the process stops): the renderer's closing word, the
    stream's end, and the route's `on_leave` (a foreground job is cancelled)."""

    async def closing_after_two() -> AsyncIterator[StreamItem]:
        for item in _tokens(2):
            yield item
        raise StreamsClosing

    left: list[str] = []

    async def read_all() -> list[bytes]:
        stream = relay(closing_after_two(), _Render(), on_leave=lambda: left.append("left"))
        return [out async for out in stream]

    assert asyncio.run(read_all()) == [b"[start][t]", b"[t]", b"[closing]", b"[end]"]
    assert left == ["left"]
