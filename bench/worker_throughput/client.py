"""The HTTP side of modes (c) and (d): N streaming chat completions from one async client.

Each request is due at `index x stagger_s` after the run's start (0 for a burst). TTFT is the
time from that moment to the first SSE chunk whose `delta.content` is non-empty; the token
count comes from the usage in the final chunks, the request id from the chunks' `id`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx

from bench.worker_throughput.servers import StreamingServer
from bench.worker_throughput.stats import CpuMeter, RequestTiming, RunResult

REQUEST_TIMEOUT_S = 1800.0


class StreamFailed(RuntimeError):
    """A benchmark request was refused or its stream carried an error."""


def run_http(
    server: StreamingServer, chats: list[list[dict]], new_tokens: int, stagger_s: float = 0.0
) -> RunResult:
    bodies = [server.request_body(chat, new_tokens) for chat in chats]
    meter = CpuMeter()
    meter.start()
    started_at, timings = asyncio.run(_run(server.chat_url, bodies, stagger_s))
    wall = max(t.end_s for t in timings)
    return RunResult(tuple(timings), wall, meter.foreign_share(), started_at)


async def _run(url: str, bodies: list[dict], stagger_s: float) -> tuple[float, list[RequestTiming]]:
    """`time.time()` at the run's start, and each request's timing."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        started_at, start = time.time(), time.perf_counter()
        return started_at, list(
            await asyncio.gather(
                *(
                    _stream_one(client, url, body, i * stagger_s, start)
                    for i, body in enumerate(bodies)
                )
            )
        )


async def _stream_one(
    client: httpx.AsyncClient, url: str, body: dict, due_s: float, start: float
) -> RequestTiming:
    delay = start + due_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    first: float | None = None
    tokens = 0
    request_id = ""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:500]
            raise StreamFailed(f"HTTP {response.status_code}: {detail}")
        async for line in _sse_lines(response):
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise StreamFailed(f"stream error: {chunk['error']}")
            request_id = request_id or str(chunk.get("id", ""))
            usage = chunk.get("usage")
            if usage:
                tokens = int(usage["completion_tokens"])
            if first is None and any(
                (choice.get("delta") or {}).get("content") for choice in chunk.get("choices", [])
            ):
                first = time.perf_counter() - start
    end = time.perf_counter() - start
    return RequestTiming(due_s, first if first is not None else end, end, tokens, request_id)


async def _sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines, split at CR/LF only, as SSE defines them. (httpx's `aiter_lines`
    also splits at U+0085, U+2028 and friends, which sampled text may hold raw inside a
    JSON string: both servers send them unescaped.)"""
    pending = ""
    async for text in response.aiter_text():
        pending += text
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if pending:
        yield pending.removesuffix("\r")
