"""What `GET /v1/cluster` reports: admission, queues, workers, recent jobs and rejections.

Everything is read from Redis (the lease set, RQ's queues and worker registry, the job
hashes), so every API process gives the same answer. Nothing here carries prompt or
generated text: recent jobs are listed by id, status, token counts and timings only.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import redis
from pydantic import BaseModel, Field
from rq import Queue, Worker
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

from api.state import AppState
from shared import keys
from shared.jobs import JobStatus
from shared.settings import Settings

_JOB_FIELDS = (
    "status",
    "model",
    "worker",
    "created_at",
    "started_at",
    "finished_at",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "error_type",
)


class QueueView(BaseModel):
    name: str = Field(description="RQ queue name")
    queued: int = Field(description="Jobs waiting in it for a worker")


class WorkerView(BaseModel):
    name: str
    state: str = Field(description="RQ's worker state: `idle`, `busy`, `started`, `suspended`")
    model: str
    capacity: int = Field(description="Jobs it decodes at once (TOKENRELAY_WORKER_CONCURRENCY)")
    running: list[str] = Field(description="Ids of the jobs it is running now")
    last_heartbeat: float | None = Field(description="Unix time of its last RQ heartbeat")
    started_at: float | None = Field(description="Unix time the worker registered")
    hostname: str | None
    pid: int | None
    succeeded: int = Field(description="Jobs it finished (RQ's count)")
    failed: int = Field(description="Jobs that failed on it (RQ's count)")


class RecentJob(BaseModel):
    id: str
    status: JobStatus
    model: str
    worker: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    queue_wait_s: float | None = Field(description="From admission to start (so far if queued)")
    run_s: float | None = Field(description="From start to end (so far if running)")
    prompt_tokens: int | None
    completion_tokens: int | None
    tokens_per_s: float | None = Field(description="Completion tokens over `run_s`")
    finish_reason: str | None
    error_type: str | None


class ClusterView(BaseModel):
    """A snapshot of the whole cluster, as every API process sees it."""

    now: float = Field(description="Redis server time (Unix seconds) of this snapshot")
    model: str = Field(description="The served model name")
    in_flight: int = Field(description="Admitted, unfinished jobs (queued or running)")
    max_inflight: int = Field(description="The global admission limit")
    queues: list[QueueView]
    workers: list[WorkerView]
    recent_jobs: list[RecentJob] = Field(description="Most recently admitted jobs, newest first")
    rejections: dict[str, int] = Field(description="Refused admissions by error type")


async def read_cluster(state: AppState, limit: int) -> ClusterView:
    """One snapshot: RQ's registries (in a thread) alongside tokenrelay's own keys."""
    (queues, workers), view = await asyncio.gather(
        asyncio.to_thread(_read_rq, state.rq_connection), _read_tokenrelay(state, limit)
    )
    view.queues = queues
    view.workers = [_worker_view(state.settings, worker, running) for worker, running in workers]
    return view


async def _read_tokenrelay(state: AppState, limit: int) -> ClusterView:
    """Admission, recent jobs and rejections in two pipelined round trips."""
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.zcard(keys.leases())
        pipe.lrange(keys.recent_jobs(), 0, limit - 1)
        pipe.hgetall(keys.rejections())
        (seconds, micros), in_flight, job_ids, rejections = await pipe.execute()
    now = seconds + micros / 1_000_000
    async with state.redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), _JOB_FIELDS)
        hashes = await pipe.execute()
    return ClusterView(
        now=now,
        model=state.settings.model_id,
        in_flight=in_flight,
        max_inflight=state.settings.max_inflight,
        queues=[],
        workers=[],
        recent_jobs=[
            _recent_job(job_id, dict(zip(_JOB_FIELDS, values, strict=True)), now)
            for job_id, values in zip(job_ids, hashes, strict=True)
            if values[0] is not None
        ],
        rejections={error_type: int(count) for error_type, count in rejections.items()},
    )


def _read_rq(connection: redis.Redis) -> tuple[list[QueueView], list[tuple[BaseWorker, list[str]]]]:
    """Queue depths and live workers with the ids of the jobs they execute (RQ's registry)."""
    queues = Queue.all(connection=connection, serializer=JSONSerializer)
    queue_views = [QueueView(name=queue.name, queued=queue.count) for queue in queues]
    workers = Worker.all(connection=connection, serializer=JSONSerializer)
    running = [
        (worker, [execution.job_id for execution in worker.get_current_executions()])
        for worker in workers
    ]
    return queue_views, running


def _worker_view(settings: Settings, worker: BaseWorker, running: list[str]) -> WorkerView:
    """Model and capacity come from the settings, which every process must share."""
    return WorkerView(
        name=worker.name,
        state=worker.get_state(),
        model=settings.model_id,
        capacity=settings.worker_concurrency,
        running=running,
        last_heartbeat=_timestamp(worker.last_heartbeat),
        started_at=_timestamp(worker.birth_date),
        hostname=worker.hostname,
        pid=worker.pid,
        succeeded=worker.successful_job_count,
        failed=worker.failed_job_count,
    )


def _recent_job(job_id: str, fields: dict[str, str | None], now: float) -> RecentJob:
    created = float(fields["created_at"] or now)
    started = _float(fields["started_at"])
    finished = _float(fields["finished_at"])
    completion = _int(fields["completion_tokens"])
    run_s = None if started is None else (finished or now) - started
    tokens_per_s = None
    if completion is not None and run_s:
        tokens_per_s = round(completion / run_s, 2)
    return RecentJob(
        id=job_id,
        status=JobStatus(fields["status"] or JobStatus.QUEUED),
        model=fields["model"] or "",
        worker=fields["worker"],
        created_at=created,
        started_at=started,
        finished_at=finished,
        queue_wait_s=_round((started or finished or now) - created),
        run_s=_round(run_s),
        prompt_tokens=_int(fields["prompt_tokens"]),
        completion_tokens=completion,
        tokens_per_s=tokens_per_s,
        finish_reason=fields["finish_reason"],
        error_type=fields["error_type"],
    )


def _timestamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _float(value: str | None) -> float | None:
    return float(value) if value is not None else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
