"""Anthropic's error shape, on every path under `/v1/messages` (`DIALECT`, which `api.errors`
applies by path): `{"type": "error", "error": {"type": ..., "message": ...}}` with Anthropic's
status codes, so that Anthropic's SDKs raise their own exception classes.

tokenrelay's errors map by status: 400 `invalid_request_error`, 401 `authentication_error`,
403 `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429
`rate_limit_error`, and every 503 (cluster at capacity, no live worker, a queue wait run out,
a worker lost, Redis unreachable: all "retry shortly", all with `Retry-After`) is Anthropic's
529 `overloaded_error`, which its SDKs retry. Other statuses keep their code, typed
`invalid_request_error` below 500 and `api_error` from 500.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from tokenrelay.api.errors import ErrorDialect
from tokenrelay.api.middleware import request_log
from tokenrelay.api.streaming import sse
from tokenrelay.shared.errors import TokenrelayError

PATH = "/v1/messages"
OVERLOADED_STATUS = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED_STATUS: "overloaded_error",
}


def status_of(status_code: int) -> int:
    """Anthropic's status for one of tokenrelay's: 503 is 529."""
    return OVERLOADED_STATUS if status_code == 503 else status_code


def body(exc: TokenrelayError, status_code: int | None = None) -> dict[str, object]:
    """The error in Anthropic's shape, typed by its (Anthropic) status."""
    status = status_of(status_code or exc.status_code)
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def event(exc: TokenrelayError) -> bytes:
    """The error as the `error` event of a stream that has started."""
    return sse.encode(json.dumps(body(exc), separators=(",", ":")), event="error")


def response(
    exc: TokenrelayError, status_code: int, headers: dict[str, str] | None
) -> JSONResponse:
    """The error's response; the request's log line and metrics keep tokenrelay's stable
    `error_type`, which Anthropic's body has no place for."""
    record = request_log.current()
    if record is not None:
        record.error_type = exc.error_type
    return JSONResponse(body(exc, status_code), status_code=status_of(status_code), headers=headers)


def unknown_field_message(field: str) -> str:
    return (
        f"`{field}` is not a field of this endpoint (neither Anthropic's Messages API nor an "
        "extension that tokenrelay implements); it is refused rather than ignored"
    )


DIALECT = ErrorDialect(prefix=PATH, render=response, unknown_field=unknown_field_message)


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error shape."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


def _doc(description: str) -> dict[str, Any]:
    return {"model": AnthropicErrorBody, "description": description}


#: The errors every route under `/v1/messages` documents in the OpenAPI schema.
MESSAGES_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _doc("Invalid request, the field named in the message (`invalid_request_error`)"),
    401: _doc("Missing or invalid API key (`authentication_error`)"),
    404: _doc("Model not served here (`not_found_error`)"),
    413: _doc("Body larger than TOKENRELAY_MAX_REQUEST_BYTES (`request_too_large`)"),
    429: _doc("The API key's own in-flight limit (`rate_limit_error`), with Retry-After"),
    OVERLOADED_STATUS: _doc(
        "Cluster at capacity, model without live workers, queue wait run out, worker lost "
        "or Redis unreachable (`overloaded_error`), with Retry-After"
    ),
}
