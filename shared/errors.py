"""One error hierarchy for the API, the worker and the events they exchange.

    TokenrelayError                 (500 internal_error)
    ├── InvalidRequest              (400 invalid_request_error)
    │   └── ContextLengthExceeded   (400 context_length_exceeded)
    ├── Unauthorized                (401 invalid_api_key)
    ├── Forbidden                   (403 forbidden)
    ├── NotFound                    (404 not_found)
    │   ├── JobNotFound             (404 job_not_found)
    │   ├── FileNotFound            (404 file_not_found)
    │   ├── BatchNotFound           (404 batch_not_found)
    │   ├── ResponseNotFound        (404 response_not_found)
    │   └── ModelNotFound           (404 model_not_found)
    ├── PayloadTooLarge             (413 request_too_large)
    ├── QuotaExceeded               (429 rate_limit_exceeded)
    ├── Overloaded                  (503 cluster_overloaded)
    ├── RedisUnavailable            (503 redis_unavailable)
    ├── ApiShuttingDown             (503 api_shutting_down)
    ├── ModelUnavailable            (503 model_unavailable)
    ├── QueueWaitExpired            (503 expired)
    ├── WorkerLost                  (503 worker_lost)
    ├── JobCancelled                (409 cancelled)
    └── GenerationFailed            (500 generation_failed)

Each class has a stable snake_case `error_type`, used alike in JSON error bodies, SSE error
events and job records, and an HTTP status in `status_code`. The messages the Lua scripts end
jobs with are class constants here too (`*_MESSAGE`); `shared.redis.scripts` passes them in.
"""

from __future__ import annotations

from typing import ClassVar


class TokenrelayError(Exception):
    """Base of every error tokenrelay reports to a client."""

    error_type: ClassVar[str] = "internal_error"
    status_code: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, dict[str, str | None]]:
        """The OpenAI error shape: `{"error": {"message", "type", "param", "code"}}`."""
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.error_type,
            }
        }


class InvalidRequest(TokenrelayError):
    error_type = "invalid_request_error"
    status_code = 400
    openai_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    error_type = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = "messages") -> None:
        super().__init__(message, param=param)


class Unauthorized(TokenrelayError):
    error_type = "invalid_api_key"
    status_code = 401
    openai_type = "authentication_error"


class Forbidden(TokenrelayError):
    """A valid key that lacks the right: the cluster view needs an admin key."""

    error_type = "forbidden"
    status_code = 403
    openai_type = "permission_error"


class NotFound(TokenrelayError):
    error_type = "not_found"
    status_code = 404
    openai_type = "invalid_request_error"


class JobNotFound(NotFound):
    error_type = "job_not_found"


class ModelNotFound(NotFound):
    error_type = "model_not_found"


class FileNotFound(NotFound):
    error_type = "file_not_found"


class BatchNotFound(NotFound):
    error_type = "batch_not_found"


class ResponseNotFound(NotFound):
    """No stored Responses API response by that id for this key (unknown, another key's,
    past its retention, or created with `store: false`)."""

    error_type = "response_not_found"


class PayloadTooLarge(TokenrelayError):
    """The request body is larger than `TOKENRELAY_MAX_REQUEST_BYTES`."""

    error_type = "request_too_large"
    status_code = 413
    openai_type = "invalid_request_error"


class Overloaded(TokenrelayError):
    """The global in-flight limit is reached; retry after `retry_after_s`."""

    error_type = "cluster_overloaded"
    status_code = 503

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(TokenrelayError):
    """The caller's API key has as many requests in flight as it may; retry later."""

    error_type = "rate_limit_exceeded"
    status_code = 429
    openai_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RedisUnavailable(TokenrelayError):
    error_type = "redis_unavailable"
    status_code = 503


class ApiShuttingDown(TokenrelayError):
    """The API process serving a stream is stopping, and its drain period ran out before the
    stream's end (`TOKENRELAY_API_DRAIN_S`)."""

    error_type = "api_shutting_down"
    status_code = 503


class ModelUnavailable(TokenrelayError):
    """The model is known, but no live worker serves it right now."""

    error_type = "model_unavailable"
    status_code = 503


class QueueWaitExpired(TokenrelayError):
    """The job was not started within `TOKENRELAY_MAX_QUEUE_WAIT_S`."""

    error_type = "expired"
    status_code = 503
    NOT_STARTED_MESSAGE: ClassVar[str] = (
        "the job was not started within the allowed queue wait; retry later"
    )


class WorkerLost(TokenrelayError):
    """The worker running the job stopped renewing its lease (it died or lost Redis)."""

    error_type = "worker_lost"
    status_code = 503
    LEASE_EXPIRED_MESSAGE: ClassVar[str] = (
        "the worker running this job stopped renewing its lease (it died or lost Redis)"
    )


class JobCancelled(TokenrelayError):
    error_type = "cancelled"
    status_code = 409
    openai_type = "invalid_request_error"
    BEFORE_START_MESSAGE: ClassVar[str] = "the job was cancelled before it started"


class GenerationFailed(TokenrelayError):
    error_type = "generation_failed"


_BY_TYPE: dict[str, type[TokenrelayError]] = {
    cls.error_type: cls
    for cls in (
        TokenrelayError,
        InvalidRequest,
        ContextLengthExceeded,
        Unauthorized,
        Forbidden,
        NotFound,
        JobNotFound,
        ModelNotFound,
        FileNotFound,
        BatchNotFound,
        ResponseNotFound,
        PayloadTooLarge,
        Overloaded,
        QuotaExceeded,
        RedisUnavailable,
        ModelUnavailable,
        QueueWaitExpired,
        WorkerLost,
        JobCancelled,
        GenerationFailed,
    )
}


def from_type(error_type: str, message: str) -> TokenrelayError:
    """Rebuild the error an event or job record names by its `error_type`."""
    return _BY_TYPE.get(error_type, TokenrelayError)(message)
