"""Exception → HTTP response, in one table; every body in the OpenAI error shape, except
under the paths of an API with a shape of its own (an `ErrorDialect`: Anthropic's under
`/v1/messages`), which `install` is given and `respond` picks by path.

Redis errors are translated here at the boundary (`redis_unavailable`, 503); request
validation errors become 400s naming the field; anything unexpected is logged and answered
with a 500 that carries no stack trace.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Scope

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


@dataclass(frozen=True)
class ErrorDialect:
    """An API whose paths (`prefix` and below) answer errors in a shape of their own:
    `render(error, status_code, headers)` makes the response, `unknown_field(name)` the
    message that refuses an undeclared field."""

    prefix: str
    render: Callable[[TokenrelayError, int, dict[str, str] | None], Response]
    unknown_field: Callable[[str], str] = unknown_field_message

    def covers(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + "/")


def dialect_of(scope: Scope) -> ErrorDialect | None:
    """The installed dialect whose paths hold the request's, if any."""
    dialects: Sequence[ErrorDialect] = getattr(scope["app"].state, "error_dialects", ())
    return next((d for d in dialects if d.covers(scope["path"])), None)


def respond(
    scope: Scope,
    exc: TokenrelayError,
    status_code: int | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The error's response (with `Retry-After` where it has one, unless `headers` are
    given), in the shape of the API the request's path belongs to."""
    status = status_code or exc.status_code
    headers = retry_headers(exc) if headers is None else headers
    dialect = dialect_of(scope)
    if dialect is None:
        return JSONResponse(exc.body(), status_code=status, headers=headers)
    return dialect.render(exc, status, headers)


def validation_message(
    exc: RequestValidationError, unknown_field: Callable[[str], str] = unknown_field_message
) -> tuple[str, str | None]:
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
        return unknown_field(field), field
    if first.get("type") == "missing":
        return f"`{field}` is required", field
    return f"`{field}`: {message}", field


def whole_body_message(request: Request, exc: RequestValidationError) -> str | None:
    """The cause, when the body as a whole was refused (not one of its fields): sent without
    a JSON Content-Type (FastAPI then sees bytes, not an object), empty (the message names
    the fields the route requires), or JSON that is no object; None otherwise."""
    errors = exc.errors()
    if not errors or any(tuple(error.get("loc", ())) != ("body",) for error in errors):
        return None
    if isinstance(exc.body, bytes | bytearray):
        given = request.headers.get("content-type")
        has = f"`Content-Type: {given}`" if given else "no Content-Type"
        return (
            "the request body must be JSON, sent with `Content-Type: application/json`; "
            f"this request has {has}"
        )
    if exc.body is None and errors[0].get("type") == "missing":
        required = [f"`{name}`" for name in _required_fields(request)]
        if not required:
            return "the request body is empty; it must be a JSON object"
        names = " and ".join([", ".join(required[:-1]), required[-1]] if required[1:] else required)
        verb = "is" if len(required) == 1 else "are"
        return f"the request body is empty: {names} {verb} required"
    if errors[0].get("type") in _NOT_AN_OBJECT and not isinstance(exc.body, dict):
        return "the request body must be a JSON object"
    return None


_NOT_AN_OBJECT = frozenset({"model_attributes_type", "dict_type", "model_type"})


def _required_fields(request: Request) -> list[str]:
    """The required fields of the matched route's body model, as a client spells them."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body_field, "field_info", None), "annotation", None)
    fields = getattr(model, "model_fields", None) or {}
    return [field.alias or name for name, field in fields.items() if field.is_required()]


def _is_noise(part: object) -> bool:
    """`body` and the union-branch tags pydantic puts in a location (`str`, `list[TextPart]`)."""
    if not isinstance(part, str):
        return False
    return part in _UNION_TAGS or "[" in part or part[:1].isupper()


_UNION_TAGS = frozenset({"body", "str", "int", "float", "bool", "none", "list", "dict"})


async def _tokenrelay_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TokenrelayError)
    return respond(request.scope, exc)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    dialect = dialect_of(request.scope)
    unknown = dialect.unknown_field if dialect is not None else unknown_field_message
    if (whole := whole_body_message(request, exc)) is not None:
        return respond(request.scope, InvalidRequest(whole))
    message, field = validation_message(exc, unknown)
    return respond(request.scope, InvalidRequest(message, param=field))


POOL_EXHAUSTED_MESSAGE = (
    "no Redis connection of this gateway process came free in time: the process is "
    "overloaded (its pool is TOKENRELAY_REDIS_POOL_SIZE) or Redis is slow to answer; "
    "retry shortly"
)


async def _redis_error(request: Request, exc: Exception) -> Response:
    log.warning("Redis unavailable: %s", exc)
    if _pool_wait_ran_out(exc):
        return respond(request.scope, RedisUnavailable(POOL_EXHAUSTED_MESSAGE))
    return respond(request.scope, RedisUnavailable("the gateway cannot reach Redis; retry shortly"))


def _pool_wait_ran_out(exc: Exception) -> bool:
    """The wait for a free connection of the pool timed out (redis-py raises a
    `ConnectionError` from the wait's `TimeoutError`), rather than a connection failing."""
    return isinstance(exc, RedisConnectionError) and isinstance(exc.__cause__, TimeoutError)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return respond(request.scope, NotFound("no such route; see /docs for the API"))
    if isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's "error parsing the body"
        cause = exc.__cause__
        message = f"the request body is not valid UTF-8 ({cause.reason} at byte {cause.start})"
        return respond(request.scope, InvalidRequest(message))
    error_class = InvalidRequest if exc.status_code < 500 else TokenrelayError
    error = error_class(str(exc.detail))
    headers = {**(exc.headers or {}), **(retry_headers(error) or {})}
    return respond(request.scope, error, exc.status_code, headers)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    error = TokenrelayError("internal error; the gateway logged the details")
    return respond(request.scope, error)


def install(app: FastAPI, dialects: Sequence[ErrorDialect] = ()) -> None:
    """The handlers, and the APIs (`dialects`) whose paths answer errors in their own shape."""
    app.state.error_dialects = tuple(dialects)
    app.add_exception_handler(TokenrelayError, _tokenrelay_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(RedisError, _redis_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
