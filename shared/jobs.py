"""Job status and the record `GET /v1/jobs/{id}` returns, read from a job's Redis hash."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from shared.events import Usage


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


class JobError(BaseModel):
    type: str
    message: str


class JobRecord(BaseModel):
    id: str
    object: str = "job"
    status: JobStatus
    model: str
    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    error: JobError | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    webhook: str | None = Field(default=None, description="The job's webhook URL, if it has one")
    webhook_events_filter: list[str] | None = Field(
        default=None, description="The transitions delivered to `webhook`"
    )

    @classmethod
    def from_redis(cls, job_id: str, fields: dict[str, str], text: str) -> JobRecord:
        """Build the record from the job hash (`shared.keys.job`) and its text."""
        prompt = fields.get("prompt_tokens")
        completion = fields.get("completion_tokens")
        usage = None
        if prompt is not None and completion is not None:
            usage = Usage(
                prompt_tokens=int(prompt),
                completion_tokens=int(completion),
                total_tokens=int(prompt) + int(completion),
            )
        webhook_events = fields.get("webhook_events")
        error = None
        if "error_type" in fields:
            error = JobError(type=fields["error_type"], message=fields.get("error_message", ""))
        return cls(
            id=job_id,
            status=JobStatus(fields["status"]),
            model=fields.get("model", ""),
            text=text,
            finish_reason=fields.get("finish_reason"),
            usage=usage,
            error=error,
            created_at=float(fields["created_at"]),
            started_at=_float_or_none(fields.get("started_at")),
            finished_at=_float_or_none(fields.get("finished_at")),
            webhook=fields.get("webhook"),
            webhook_events_filter=webhook_events.split(",") if webhook_events else None,
        )


def _float_or_none(value: str | None) -> float | None:
    return float(value) if value is not None else None
