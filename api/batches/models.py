"""OpenAI's batch object, its create request, its list page, and how a batch's Redis hash
(`shared.redis.keys.batch`) maps to them."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenrelay.api.webhooks.policy import MAX_URL_LENGTH

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
MAX_METADATA_PAIRS = 16


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (
            BatchStatus.FAILED,
            BatchStatus.COMPLETED,
            BatchStatus.EXPIRED,
            BatchStatus.CANCELLED,
        )


class BatchField(StrEnum):
    """The batch hash's own fields besides the batch object's timestamps and counts."""

    OWNER = "owner"
    STATUS = "status"
    ENDPOINT = "endpoint"
    INPUT_FILE_ID = "input_file_id"
    METADATA = "metadata"
    ERRORS = "errors"
    OUTPUT_FILE_ID = "output_file_id"
    ERROR_FILE_ID = "error_file_id"
    TOTAL = "total"
    COMPLETED = "completed"
    FAILED = "failed"
    NEXT_LINE = "next_line"
    #: Why the batch stops before every line ran: `cancel` or `expire`.
    STOP = "stop"
    #: The feeder (API process) whose lease holds the batch.
    FEEDER = "feeder"
    #: Where to POST the batch object when it ends (`BatchCreate.webhook`).
    WEBHOOK = "webhook"


TIMESTAMPS = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


class BatchCreate(BaseModel):
    """`POST /v1/batches`."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=64)
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = Field(
        default=None, max_length=MAX_METADATA_PAIRS, description="Up to 16 key-value pairs"
    )
    webhook: str | None = Field(
        default=None,
        max_length=MAX_URL_LENGTH,
        description=(
            "tokenrelay's extension: http(s) URL to POST the batch object to once, when the "
            "batch ends (completed, failed, expired or cancelled), signed as job webhooks are "
            "(Standard Webhooks headers); its host must be on the gateway's allow-list."
        ),
    )


class BatchErrorItem(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchErrorItem]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    """OpenAI's batch object."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: Literal["24h"] = "24h"
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    webhook: str | None = Field(
        default=None, description="tokenrelay's extension: the batch's webhook URL, if any"
    )

    @classmethod
    def from_redis(cls, batch_id: str, fields: dict[str, str]) -> Batch:
        errors = fields.get(BatchField.ERRORS)
        metadata = fields.get(BatchField.METADATA)
        stamps = {name: int(fields[name]) for name in TIMESTAMPS if name in fields}
        return cls(
            id=batch_id,
            endpoint=fields[BatchField.ENDPOINT],
            errors=BatchErrors.model_validate_json(errors) if errors else None,
            input_file_id=fields[BatchField.INPUT_FILE_ID],
            status=BatchStatus(fields[BatchField.STATUS]),
            output_file_id=fields.get(BatchField.OUTPUT_FILE_ID),
            error_file_id=fields.get(BatchField.ERROR_FILE_ID),
            request_counts=RequestCounts(
                total=int(fields.get(BatchField.TOTAL, 0)),
                completed=int(fields.get(BatchField.COMPLETED, 0)),
                failed=int(fields.get(BatchField.FAILED, 0)),
            ),
            metadata=json.loads(metadata) if metadata else None,
            webhook=fields.get(BatchField.WEBHOOK),
            **stamps,  # type: ignore[arg-type]
        )


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool
