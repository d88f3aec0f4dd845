"""The error body and responses every route documents in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str


class ErrorBody(BaseModel):
    """OpenAI's error shape; `code` is tokenrelay's stable `error_type`."""

    error: ErrorDetail


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _doc("Missing or invalid API key (`invalid_api_key`)"),
    503: _doc("Redis unreachable (`redis_unavailable`), with Retry-After and retry-after-ms"),
}

MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    404: _doc("No live worker serves that model (`model_not_found`)"),
}

SUBMIT_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _doc(
        "Invalid request: the message names the field (`invalid_request_error`, "
        "`context_length_exceeded`)"
    ),
    404: _doc("Unknown model (`model_not_found`)"),
    413: _doc("Body larger than TOKENRELAY_MAX_REQUEST_BYTES (`request_too_large`)"),
    429: _doc(
        "The API key's own in-flight limit (`rate_limit_exceeded`), with Retry-After"
        " and a jittered retry-after-ms"
    ),
    503: _doc(
        "Cluster at capacity (`cluster_overloaded`), model without live workers "
        "(`model_unavailable`), job expired in the queue (`expired`), worker lost "
        "(`worker_lost`) or Redis unreachable (`redis_unavailable`); every 503 has "
        "Retry-After and a jittered retry-after-ms"
    ),
    401: AUTH_ERRORS[401],
}

JOB_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    400: _doc("Invalid `Last-Event-ID`"),
    404: _doc("No such job, or another key's job (`job_not_found`)"),
}

FILE_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    404: _doc("No such file, or another key's file (`file_not_found`)"),
}

UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _doc("Bad form, wrong `purpose`, or more lines than TOKENRELAY_FILE_MAX_REQUESTS"),
    413: _doc("File larger than TOKENRELAY_FILE_MAX_BYTES (`request_too_large`)"),
}

BATCH_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    400: _doc("Invalid request: the message names the field (`invalid_request_error`)"),
    404: _doc("No such batch or input file, or another key's (`batch_not_found`)"),
}

RESPONSE_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    400: _doc("Invalid request: the message names the field (`invalid_request_error`)"),
    404: _doc(
        "No stored response by that id for this key, or created with `store: false` "
        "(`response_not_found`)"
    ),
}
