"""Job status, the job hash's field names, and the record `GET /v1/jobs/{id}` returns, read
from a job's Redis hash."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from tokenrelay.shared.events import Error, Usage


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


class JobField(StrEnum):
    """The field names of a job's Redis hash (`shared.redis.keys.job`), spelled here only.

    A StrEnum rather than a class of constants: members are `str`, so they go straight into
    redis-py calls and dict lookups, and the enum can be iterated; the names the Lua scripts
    use are compiled into them from here (`shared.redis.scripts.library_bindings`)."""

    STATUS = "status"
    OWNER = "owner"
    OWNER_JOBS = "owner_jobs"
    MODEL = "model"
    WORKER = "worker"
    CREATED_AT = "created_at"
    STARTED_AT = "started_at"
    FINISHED_AT = "finished_at"
    NEXT_SEQ = "next_seq"
    CANCEL_REQUESTED = "cancel_requested"
    PROMPT_TOKENS = "prompt_tokens"
    COMPLETION_TOKENS = "completion_tokens"
    CACHED_TOKENS = "cached_tokens"
    FINISH_REASON = "finish_reason"
    ERROR_TYPE = "error_type"
    ERROR_MESSAGE = "error_message"
    WEBHOOK = "webhook"
    WEBHOOK_EVENTS = "webhook_events"
    READER = "reader"
    ATTEMPT = "attempt"
    PAST_WORKERS = "past_workers"
    MAX_ATTEMPTS = "max_attempts"
    REQUEUE_MS = "requeue_ms"
    SEAM_SEQ = "seam_seq"


def error_fields(error: Error) -> dict[str, str]:
    """The job hash fields that record `error`."""
    return {JobField.ERROR_TYPE: error.error_type, JobField.ERROR_MESSAGE: error.message}


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
    attempts: int = Field(
        default=1, description="How many workers have started the job: 1 unless it was continued"
    )
    workers: list[str] = Field(
        default_factory=list, description="The workers that ran the job, in order"
    )

    @classmethod
    def from_redis(cls, job_id: str, fields: dict[str, str], text: str) -> JobRecord:
        """Build the record from the job hash (`shared.redis.keys.job`) and its text."""
        prompt = fields.get(JobField.PROMPT_TOKENS)
        completion = fields.get(JobField.COMPLETION_TOKENS)
        usage = None
        if prompt is not None and completion is not None:
            usage = Usage(
                prompt_tokens=int(prompt),
                completion_tokens=int(completion),
                total_tokens=int(prompt) + int(completion),
                cached_tokens=int(fields.get(JobField.CACHED_TOKENS, 0)),
            )
        webhook_events = fields.get(JobField.WEBHOOK_EVENTS)
        error = None
        if JobField.ERROR_TYPE in fields:
            error = JobError(
                type=fields[JobField.ERROR_TYPE], message=fields.get(JobField.ERROR_MESSAGE, "")
            )
        return cls(
            id=job_id,
            status=JobStatus(fields[JobField.STATUS]),
            model=fields.get(JobField.MODEL, ""),
            text=text,
            finish_reason=fields.get(JobField.FINISH_REASON),
            usage=usage,
            error=error,
            created_at=float(fields[JobField.CREATED_AT]),
            started_at=_float_or_none(fields.get(JobField.STARTED_AT)),
            finished_at=_float_or_none(fields.get(JobField.FINISHED_AT)),
            webhook=fields.get(JobField.WEBHOOK),
            webhook_events_filter=webhook_events.split(",") if webhook_events else None,
            attempts=int(fields.get(JobField.ATTEMPT, 1)),
            workers=_workers(fields),
        )


def _workers(fields: dict[str, str]) -> list[str]:
    """The workers that ran the job: those of its earlier attempts (`PAST_WORKERS`, joined by
    commas by the reaper that continued it), then the one running or ending it."""
    past = fields.get(JobField.PAST_WORKERS)
    workers = past.split(",") if past else []
    if current := fields.get(JobField.WORKER):
        workers.append(current)
    return workers


def _float_or_none(value: str | None) -> float | None:
    return float(value) if value is not None else None
