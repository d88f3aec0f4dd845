"""Exception → HTTP response, in one table; every body in the OpenAI error shape.

Redis errors are translated here at the boundary (`redis_unavailable`, 503); request
validation errors become 400s naming the field; anything unexpected is logged and answered
with a 500 that carries no stack trace.
"""

from __future__ import annotations

import logging
import random

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException

from tokenrelay.api.openai.field_support import unknown_field_message
from tokenrelay.shared.errors import (
    InvalidRequest,
    NotFound,
    Overloaded,
    QuotaExceeded,
    RedisUnavailable,
    TokenrelayError,
)

log = logging.getLogger(__name__)


#: `retry-after-ms` is `Retry-After` times a factor drawn from this range, so the clients one
#: moment refuses do not all come back in the same instant (the OpenAI SDKs read it first).
RETRY_JITTER = (0.5, 1.5)


def retry_headers(exc: TokenrelayError) -> dict[str, str] | None:
    """`Retry-After` and a jittered `retry-after-ms` for every 429 and 503, else None."""
    if exc.status_code not in (429, 503):
        return None
    retry_after_s = exc.retry_after_s if isinstance(exc, Overloaded | QuotaExceeded) else 1
    retry_after_ms = round(retry_after_s * 1000 * random.uniform(*RETRY_JITTER))
    return {"Retry-After": str(retry_after_s), "retry-after-ms": str(retry_after_ms)}


def error_response(exc: TokenrelayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code, headers=retry_headers(exc))


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    # The deepest error is the most specific: for `content: [{"type": "image_url"}]` it is
    # the part's `type`, not the `str` branch of the union that also failed.
    first = max(exc.errors(), key=lambda error: len(error.get("loc", ())))
    location = [str(part) for part in first.get("loc", ()) if not _is_noise(part)]
    field = ".".join(location) or None
    message = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if field is None:
        return f"invalid request body: {message}", None
    if first.get("type") == "extra_forbidden":
        return unknown_field_message(field), field
    return f"`{field}`: {message}", field


def _is_noise(part: object) -> bool:
    """`body` and the union-branch tags pydantic puts in a location (`str`, `list[TextPart]`)."""
    if not isinstance(part, str):
        return False
    return part in _UNION_TAGS or "[" in part or part[:1].isupper()


_UNION_TAGS = frozenset({"body", "str", "int", "float", "bool", "none", "list", "dict"})


async def _tokenrelay_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TokenrelayError)
    return error_response(exc)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, field = validation_message(exc)
    return error_response(InvalidRequest(message, param=field))


POOL_EXHAUSTED_MESSAGE = (
    "no Redis connection of this gateway process came free in time: the process is "
    "overloaded (its pool is TOKENRELAY_REDIS_POOL_SIZE) or Redis is slow to answer; "
    "retry shortly"
)


async def _redis_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis unavailable: %s", exc)
    if _pool_wait_ran_out(exc):
        return error_response(RedisUnavailable(POOL_EXHAUSTED_MESSAGE))
    return error_response(RedisUnavailable("the gateway cannot reach Redis; retry shortly"))


def _pool_wait_ran_out(exc: Exception) -> bool:
    """The wait for a free connection of the pool timed out (redis-py raises a
    `ConnectionError` from the wait's `TimeoutError`), rather than a connection failing."""
    return isinstance(exc, RedisConnectionError) and isinstance(exc.__cause__, TimeoutError)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound("no such route; see /docs for the API"))
    if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's "error parsing the body"
        cause = exc.__cause__
        message = f"the request body is not valid UTF-8 ({cause.reason} at byte {cause.start})"
        return error_response(InvalidRequest(message))
    error_class = InvalidRequest if exc.status_code < 500 else TokenrelayError
    error = error_class(str(exc.detail))
    headers = {**(exc.headers or {}), **(retry_headers(error) or {})}
    return JSONResponse(error.body(), status_code=exc.status_code, headers=headers or None)


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return error_response(TokenrelayError("internal error; the gateway logged the details"))


def install(app: FastAPI) -> None:
    app.add_exception_handler(TokenrelayError, _tokenrelay_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(RedisError, _redis_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
