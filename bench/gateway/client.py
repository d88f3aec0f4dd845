"""The load generator of `bench.gateway`: streaming chat completions over raw sockets.

Each simulated client holds one keep-alive HTTP/1.1 connection to one API process and runs
streams back to back until told to stop. It parses only what the measurements need — the
status line, the chunked framing, SSE `data:` lines and the delta's `content` — so that the
client costs far less CPU per event than httpx would and is not mistaken for the gateway.

Four dialects: chat completions (`POST /v1/chat/completions`, tokens in `"content"`, ends
with `[DONE]`), Anthropic's messages (`POST /v1/messages`, tokens in `text_delta`s' `"text"`,
ends with `message_stop`), OpenAI's responses (`POST /v1/responses`, tokens in
`output_text.delta`s' `"delta"`, ends with `response.incomplete`) and job events
(`GET /v1/jobs/{id}/events`, tokens in `"text"`, ends with the `done` event). The synthetic
engine and the relay benchmark's publisher emit one vocabulary word (ending in a space) per
token, so a chunk's token count is the number of spaces in it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

_READ_SIZE = 1 << 16
_RETRY_PAUSE_S = 0.05


class ProtocolError(Exception):
    """The server's response was not the SSE stream this client expects."""


@dataclass(frozen=True)
class Window:
    """The measurement window, in `time.perf_counter()` seconds."""

    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class StreamSample:
    """One stream started inside the window: enough to split its time to first token."""

    job_id: str
    api_index: int
    sent_wall_s: float
    first_token_wall_s: float


@dataclass
class LoadStats:
    """What the clients saw; token counts and delays only inside the window."""

    api_count: int
    ttft_s: list[float] = field(default_factory=list)
    itl_added_s: list[float] = field(default_factory=list)
    chunk_gap_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    samples: list[StreamSample] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    streams_started: int = 0
    streams_completed: int = 0
    active: int = 0
    tokens_total: int = 0
    tokens_by_api: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens_by_api = [0] * self.api_count


@dataclass(frozen=True)
class SseDialect:
    """Where a stream's SSE payloads carry token text, and what marks their end."""

    text_key: bytes
    end: bytes
    error: bytes
    request_starts_job: bool
    #: What precedes the job id in the stream's id field (none: the stream names no job).
    id_key: bytes = b""


# Errors: the gateway's own `{"error": {...}}` payloads, and a job's `"type":"error"` event.
CHAT = SseDialect(
    text_key=b'"content":"',
    end=b"[DONE]",
    error=b'"error"',
    request_starts_job=True,
    id_key=b'"id":"chatcmpl-',
)
MESSAGES = SseDialect(
    text_key=b'"text":"',
    end=b'"type":"message_stop"',
    error=b'"type":"error"',
    request_starts_job=True,
    id_key=b'"id":"msg_',
)
# The synthetic engine runs every reply to its `max_output_tokens`: `response.incomplete`.
RESPONSES = SseDialect(
    text_key=b'"delta":"',
    end=b'"type":"response.incomplete"',
    error=b'"type":"error"',
    request_starts_job=True,
    id_key=b'"id":"resp_',
)
JOB_EVENTS = SseDialect(
    text_key=b'"text":"', end=b'"type":"done"', error=b'"error"', request_starts_job=False
)

RequestFactory = Callable[[int], Awaitable[bytes]]
"""Given an API index, the bytes of the next stream's HTTP request."""


@dataclass(frozen=True)
class StreamRequests:
    """`POST path` of a streaming generation of `max_tokens`: the same request every time.
    Chat completions and Anthropic's messages take the same body here."""

    path: str
    model: str
    max_tokens: int
    ports: list[int]

    def body(self) -> dict[str, object]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": "benchmark"}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }

    def wire(self, port: int) -> bytes:
        body = json.dumps(self.body()).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def __call__(self, api_index: int) -> bytes:
        return self.wire(self.ports[api_index])


@dataclass(frozen=True)
class ResponsesRequests(StreamRequests):
    """`POST /v1/responses`, streamed; `store: false` (as the Codex CLI sends) measures the
    renderer alone, `store: true` (the SDK's default) adds the response's record."""

    store: bool = False

    def body(self) -> dict[str, object]:
        return {
            "model": self.model,
            "input": "benchmark",
            "max_output_tokens": self.max_tokens,
            "stream": True,
            "store": self.store,
        }


def _stored_responses(path: str, model: str, max_tokens: int, ports: list[int]) -> StreamRequests:
    return ResponsesRequests(path, model, max_tokens, ports, store=True)


#: The generation APIs `bench.gateway --api` runs: each one's path, SSE dialect and requests.
APIS: dict[str, tuple[str, SseDialect, Callable[[str, str, int, list[int]], StreamRequests]]] = {
    "chat": ("/v1/chat/completions", CHAT, StreamRequests),
    "messages": ("/v1/messages", MESSAGES, StreamRequests),
    "responses": ("/v1/responses", RESPONSES, ResponsesRequests),
    "responses-stored": ("/v1/responses", RESPONSES, _stored_responses),
}


def job_events_request(job_id: str, port: int) -> bytes:
    return f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


class _Dechunker:
    """Incremental decoder of HTTP/1.1 chunked framing (no trailers)."""

    def __init__(self, data: bytes) -> None:
        self._buf = data
        self._size = -1
        self._last_chunk = False
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out: list[bytes] = []
        while not self.finished:
            if self._last_chunk:
                if len(self._buf) < 2:
                    break
                self._buf = self._buf[2:]
                self.finished = True
            elif self._size < 0:
                eol = self._buf.find(b"\r\n")
                if eol < 0:
                    break
                self._size = int(self._buf[:eol].split(b";")[0], 16)
                self._buf = self._buf[eol + 2 :]
                self._last_chunk = self._size == 0
            elif len(self._buf) >= self._size + 2:
                out.append(self._buf[: self._size])
                self._buf = self._buf[self._size + 2 :]
                self._size = -1
            else:
                break
        return b"".join(out)


def _tokens(payload: bytes, text_key: bytes) -> int:
    start = payload.find(text_key)
    if start < 0:
        return 0
    start += len(text_key)
    return payload.count(b" ", start, payload.index(b'"', start))


def _job_id(payload: bytes, id_key: bytes) -> str:
    """The job id after `id_key` (a chat chunk's `chatcmpl-`, a message's `msg_`); ''
    where the payload has none."""
    start = payload.find(id_key) if id_key else -1
    if start < 0:
        return ""
    start += len(id_key)
    return payload[start : payload.index(b'"', start)].decode()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head[:-4].split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class LoadGenerator:
    def __init__(
        self,
        ports: list[int],
        requests: RequestFactory,
        dialect: SseDialect,
        interval_s: float,
        window: Window,
        stats: LoadStats,
    ) -> None:
        self._ports = ports
        self._requests = requests
        self._dialect = dialect
        self._interval_s = interval_s
        self._window = window
        self._stats = stats

    async def client(self, index: int, start_at: float, stop_at: float) -> None:
        """Run streams back to back from `start_at`; start none after `stop_at`."""
        api_index = index % len(self._ports)
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while time.perf_counter() < stop_at:
            if connection is None:
                try:
                    connection = await asyncio.open_connection("127.0.0.1", self._ports[api_index])
                except OSError as exc:
                    self._stats.errors[f"connect: {type(exc).__name__}"] += 1
                    await asyncio.sleep(_RETRY_PAUSE_S)
                    continue
            self._stats.streams_started += 1
            self._stats.active += 1
            try:
                keep = await self._stream(*connection, api_index)
            except (OSError, asyncio.IncompleteReadError, ProtocolError, ValueError) as exc:
                self._stats.errors[type(exc).__name__] += 1
                keep = False
            finally:
                self._stats.active -= 1
            if not keep:
                connection[1].close()
                connection = None
        if connection is not None:
            connection[1].close()

    async def _stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_index: int
    ) -> bool:
        """One stream; returns whether the connection can carry the next one."""
        stats, window, dialect = self._stats, self._window, self._dialect
        wire = await self._requests(api_index)
        sent, sent_wall = time.perf_counter(), time.time()
        writer.write(wire)
        status, headers = await _read_head(reader)
        if status != 200:
            length = int(headers.get(b"content-length", b"0"))
            body = await reader.readexactly(length)
            stats.errors[f"http {status}: {body[:120].decode(errors='replace')}"] += 1
            await asyncio.sleep(_RETRY_PAUSE_S)
            return True
        if headers.get(b"transfer-encoding") != b"chunked":
            raise ProtocolError("expected a chunked SSE response")
        dechunker = _Dechunker(b"")
        pending = b""
        job_id = ""
        first = previous = 0.0
        done = False
        while not dechunker.finished:
            data = await reader.read(_READ_SIZE)
            if not data:
                raise ProtocolError("connection closed mid-stream")
            now = time.perf_counter()
            events = (pending + dechunker.feed(data)).split(b"\n\n")
            pending = events.pop()
            for event in events:
                if b"data: " not in event:
                    continue  # `: ping` comments
                payload = event[event.index(b"data: ") + 6 :]
                if dialect.end in payload:
                    done = True
                    continue
                if dialect.error in payload:
                    stats.errors[f"error event: {payload[:120].decode(errors='replace')}"] += 1
                    done = True
                    continue
                if not job_id and not first:
                    job_id = _job_id(payload, dialect.id_key)
                tokens = _tokens(payload, dialect.text_key)
                if not tokens:
                    continue
                if not first:
                    first = now
                    if window.holds(sent) and dialect.request_starts_job:
                        stats.ttft_s.append(now - sent)
                        if job_id:
                            wall = sent_wall + (now - sent)
                            stats.samples.append(StreamSample(job_id, api_index, sent_wall, wall))
                elif window.holds(now):
                    stats.itl_added_s.append(now - previous - tokens * self._interval_s)
                    stats.chunk_gap_s.append(now - previous)
                    stats.chunk_tokens.append(tokens)
                previous = now
                if window.holds(now):
                    stats.tokens_by_api[api_index] += tokens
                stats.tokens_total += tokens
        if not done:
            raise ProtocolError("stream ended without [DONE]")
        stats.streams_completed += 1
        return headers.get(b"connection") != b"close"
