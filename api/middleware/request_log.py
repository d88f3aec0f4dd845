"""One structured (JSON) log line per HTTP request, and the record the routes fill for it.

`RequestLog` is a pure ASGI middleware: it opens a `RequestRecord` for each request and
makes it `current()` for the code that serves the request (routes, dependencies, the body
of a streaming response), which notes what it learns: the job id, the caller's key id (the
owner hash, never the key), the model, token counts and timings. When the response's last
byte is handed to the server (or the app fails), the request is counted in the metrics and
logged as one line on the `tokenrelay.requests` logger:

    {"ts": 1767000000.123, "method": "POST", "path": "/v1/chat/completions", "status": 200,
     "job_id": "…", "key_id": "anonymous", "model": "tiny", "job_status": "succeeded",
     "prompt_tokens": 21, "completion_tokens": 8, "ttft_s": 0.041, "duration_s": 0.18, …}

Prompt text is never logged unless `TOKENRELAY_LOG_PROMPTS` is set. Probes, `/metrics` and
polls (a request with the `POLL_HEADER`, as the console's refreshes of its views) log at DEBUG,
everything else at INFO; `shared/log_config.py` formats the line (`TOKENRELAY_LOG_FORMAT`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenrelay.api.middleware.request_id import request_id
from tokenrelay.shared import log_config
from tokenrelay.shared.generation import GenerationRequest

if TYPE_CHECKING:
    # Not at run time: this module needs none of it, and prometheus-client reads
    # PROMETHEUS_MULTIPROC_DIR when it is first imported, which `tokenrelay api` sets late.
    from tokenrelay.api.metrics import Metrics

LOGGER_NAME = log_config.REQUEST_LOGGER
UNMATCHED = "unmatched"
POLL_HEADER = "x-tokenrelay-poll"
"""A request header that marks a periodic refresh (the console's views, `tokenrelay top`):
its request is logged at DEBUG, so an open console tab does not fill the INFO log."""
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_ERROR_BODY_MAX_BYTES = 8192

log = logging.getLogger(LOGGER_NAME)


@dataclass
class RequestRecord:
    """What one request did; `None` where it does not apply (no job, no tokens)."""

    method: str
    path: str
    log_prompts: bool
    metrics: Metrics | None = None
    arrived: float = field(default_factory=time.monotonic)
    arrived_at: float = field(default_factory=time.time)
    endpoint: str = UNMATCHED
    request_id: str = ""
    status: int | None = None
    error_type: str | None = None
    job_id: str | None = None
    key_id: str | None = None
    model: str | None = None
    prompt: Any = None
    job_status: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    queue_wait_s: float | None = None
    ttft_s: float | None = None
    duration_s: float | None = None
    finished: bool = False
    _error_body: bytearray = field(default_factory=bytearray, repr=False)

    def since_arrival(self) -> float:
        return time.monotonic() - self.arrived

    def fields(self) -> dict[str, Any]:
        """The log line's fields; `prompt` only when prompts are logged."""
        fields: dict[str, Any] = {
            "ts": round(self.arrived_at, 3),
            "pid": os.getpid(),
            "method": self.method,
            "path": self.path,
            "endpoint": self.endpoint,
            "request_id": self.request_id,
            "status": self.status,
            "error_type": self.error_type,
            "job_id": self.job_id,
            "key_id": self.key_id,
            "model": self.model,
            "job_status": self.job_status,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "queue_wait_s": _ms(self.queue_wait_s),
            "ttft_s": _ms(self.ttft_s),
            "duration_s": _ms(self.duration_s),
        }
        if self.log_prompts and self.prompt is not None:
            fields["prompt"] = self.prompt
        return fields

    def line(self) -> str:
        """The JSON log line."""
        return json.dumps(self.fields(), ensure_ascii=False)


_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "tokenrelay_request", default=None
)


def current() -> RequestRecord | None:
    """The record of the request being served, if any (`None` outside a request)."""
    return _current.get()


@contextlib.contextmanager
def recording(record: RequestRecord) -> Iterator[RequestRecord]:
    """Make `record` the current one for the code run inside (and the tasks it starts)."""
    token = _current.set(record)
    try:
        yield record
    finally:
        _current.reset(token)


def note_generation(key_id: str, request: GenerationRequest) -> None:
    """A generation is being submitted for `key_id` (the owner hash, never the key)."""
    record = current()
    if record is None:
        return
    record.key_id = key_id
    record.model = request.model
    if record.log_prompts:
        record.prompt = (
            request.prompt
            if request.prompt is not None
            else [message.model_dump(exclude_defaults=True) for message in request.messages]
        )


def note_job(job_id: str, key_id: str | None = None) -> None:
    """The request concerns job `job_id` (admitted now, or looked up)."""
    record = current()
    if record is None:
        return
    record.job_id = job_id
    if key_id is not None:
        record.key_id = key_id


class RequestLog:
    """ASGI middleware: a `RequestRecord` per HTTP request, counted and logged at its end."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, log_prompts: bool) -> None:
        self.app = app
        self.metrics = metrics
        self.log_prompts = log_prompts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(
            method=scope["method"],
            path=scope["path"],
            log_prompts=self.log_prompts,
            metrics=self.metrics,
            request_id=request_id(scope),
        )

        async def watched_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
            elif message["type"] == "http.response.body":
                if record.status is not None and record.status >= 400:
                    room = _ERROR_BODY_MAX_BYTES - len(record._error_body)
                    record._error_body += message.get("body", b"")[: max(room, 0)]
                if not message.get("more_body", False):
                    self._finish(scope, record)  # before the last byte: the client sees it done
            await send(message)

        with recording(record):
            try:
                await self.app(scope, receive, watched_send)
            except BaseException:
                if record.status is None:
                    record.status = 500
                raise
            finally:
                self._finish(scope, record)

    def _finish(self, scope: Scope, record: RequestRecord) -> None:
        if record.finished:
            return
        record.finished = True
        record.duration_s = record.since_arrival()
        record.endpoint = _endpoint(scope)
        if record.status is None:
            record.status = 500  # the app returned without a response (client gone)
        record.error_type = record.error_type or _error_type(bytes(record._error_body))
        self.metrics.count_request(record.method, record.endpoint, record.status, record.error_type)
        quiet = record.path in _QUIET_PATHS or _is_poll(scope)
        level = logging.DEBUG if quiet else logging.INFO
        if log.isEnabledFor(level):
            fields = record.fields()
            log.log(
                level,
                json.dumps(fields, ensure_ascii=False),
                extra={log_config.REQUEST_FIELDS: fields},
            )


def _is_poll(scope: Scope) -> bool:
    name = POLL_HEADER.encode()
    return any(key == name for key, _ in scope.get("headers", ()))


def _endpoint(scope: Scope) -> str:
    """The route's path template (a bounded label value); `unmatched` when no route ran:
    unknown paths, and bodies refused for their size before routing."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else UNMATCHED


def _error_type(body: bytes) -> str | None:
    """`error.code` of an OpenAI-shaped error body (tokenrelay's `error_type`)."""
    if not body:
        return None
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "unknown"
    return code if isinstance(code, str) and code else "unknown"


def _ms(seconds: float | None) -> float | None:
    return round(seconds, 3) if seconds is not None else None
