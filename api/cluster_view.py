"""The one reader of the cluster's state: what `GET /v1/cluster` reports (admission, queues,
workers, recent jobs, rejections) and the gauges of a `/metrics` scrape.

Everything is read from Redis (the lease set, RQ's queues and worker registry, the workers'
own registrations, the job hashes), so every API process gives the same answer. Only
tokenrelay's RQ queues (`shared.redis.rq_jobs.queue_model`) and the RQ workers that listen on
them count: other applications may share the Redis. Nothing here carries prompt or
generated text: recent jobs are listed by id, status, token counts and timings only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import cast

import redis
import redis.asyncio
from pydantic import BaseModel, Field
from redis.exceptions import RedisError
from rq import Queue, Worker
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

from tokenrelay.api.state import AppState
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import connect as redis_connect
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.rq_jobs import PRIORITIES, queue_model

GAUGE_TIMEOUT_S = 1.0  # per gauge of a scrape (three in all)
# What a worker's registration holds (shared/redis/lua/register_worker.lua writes it). The app's
# Redis client decodes replies: keys and values read here are `str`.
_REGISTRATION_FIELDS = ("model", "capacity")

_JOB_FIELDS = (
    JobField.STATUS,
    JobField.MODEL,
    JobField.WORKER,
    JobField.CREATED_AT,
    JobField.STARTED_AT,
    JobField.FINISHED_AT,
    JobField.PROMPT_TOKENS,
    JobField.COMPLETION_TOKENS,
    JobField.FINISH_REASON,
    JobField.ERROR_TYPE,
)


class QueueView(BaseModel):
    name: str = Field(description="RQ queue name")
    queued: int = Field(description="Jobs waiting in it for a worker")


class WorkerView(BaseModel):
    name: str
    state: str = Field(description="RQ's worker state: `idle`, `busy`, `started`, `suspended`")
    model: str = Field(description="The model it serves, from its registration")
    capacity: int | None = Field(
        description="Jobs it decodes at once (its TOKENRELAY_WORKER_CONCURRENCY), from its "
        "registration; null while it has none (not yet written, or lapsed with its heartbeat)"
    )
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


@dataclass
class ClusterGauges:
    """The cluster gauges of a scrape; `None` where the read failed or ran out of time."""

    max_inflight: int
    redis_up: bool = False
    in_flight: int | None = None
    queues: dict[str, int] | None = None
    workers: int | None = None
    migrations: int | None = None


async def read_gauges(state: AppState) -> ClusterGauges:
    """In-flight jobs, queue depths and live workers, each read within `GAUGE_TIMEOUT_S` on
    the app's Redis pool; never raises."""
    gauges = ClusterGauges(max_inflight=state.settings.max_inflight)
    client = state.redis
    try:
        async with asyncio.timeout(GAUGE_TIMEOUT_S):
            role = await client.execute_command("ROLE")
            gauges.in_flight = await client.zcard(keys.leases())
            gauges.migrations = int(await client.get(keys.migrations()) or 0)
    except (RedisError, OSError, TimeoutError):
        return gauges
    gauges.redis_up = redis_connect.is_primary(role)
    with contextlib.suppress(RedisError, OSError, TimeoutError):
        async with asyncio.timeout(GAUGE_TIMEOUT_S):
            depths = await _queue_depths(client)
            gauges.queues = _every_priority(depths, [state.settings.model_id])
    with contextlib.suppress(RedisError, OSError, TimeoutError):
        async with asyncio.timeout(GAUGE_TIMEOUT_S):
            gauges.workers = len(await _worker_models(client))
    return gauges


async def read_cluster(state: AppState, limit: int) -> ClusterView:
    """One snapshot: tokenrelay's own keys, its RQ queues and workers, and what RQ records of
    each worker (in a thread: RQ has no async API) beside its own registration."""
    view, queues, models = await asyncio.gather(
        _read_tokenrelay(state, limit), _queue_depths(state.redis), _worker_models(state.redis)
    )
    names = sorted(models)
    found, registrations = await asyncio.gather(
        asyncio.to_thread(_rq_workers, state.rq_connection, names),
        _registrations(state.redis, names),
    )
    served = [state.settings.model_id, *models.values()]
    queues = _every_priority(queues, served)
    view.queues = [QueueView(name=name, queued=count) for name, count in queues.items()]
    view.workers = [
        _worker_view(worker, running, models[worker.name], registrations[worker.name])
        for worker, running in found
    ]
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


async def _queue_depths(client: redis.asyncio.Redis) -> dict[str, int]:
    """Jobs waiting in each of tokenrelay's RQ queues, by name (RQ lists a queue once a job
    was put on it), a model's queue counting too the jobs of its priority placed by prefix
    on one of its workers (`api.jobs.placement`: they wait in that worker's own queue, which
    RQ does not list): what waits for the model, wherever."""
    prefix = Queue.redis_queue_namespace_prefix
    listed = cast("set[str]", await client.smembers(Queue.redis_queues_keys))
    names = sorted(
        key.removeprefix(prefix)
        for key in listed
        if key.startswith(prefix) and queue_model(key.removeprefix(prefix)) is not None
    )
    models = sorted({model for name in names if (model := queue_model(name)) is not None})
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.llen(prefix + name)
        for model in models:
            pipe.zrange(keys.placement_workers(model), 0, -1)
        replies = await pipe.execute()
    depths = dict(zip(names, replies[: len(names)], strict=True))
    placed = [
        (model, worker, priority)
        for model, workers in zip(models, replies[len(names) :], strict=True)
        for worker in workers
        for priority in PRIORITIES
    ]
    if placed:
        async with client.pipeline(transaction=False) as pipe:
            for _, worker, priority in placed:
                pipe.llen(prefix + keys.worker_queue(worker, priority))
            lengths = await pipe.execute()
        for (model, _, priority), length in zip(placed, lengths, strict=True):
            queue = keys.generation_queue(model, priority)
            depths[queue] = depths.get(queue, 0) + length
    return depths


def _every_priority(depths: dict[str, int], models: Iterable[str]) -> dict[str, int]:
    """`depths` with every priority's queue of each model of theirs and of `models`, empty
    ones included (RQ lists a queue only once a job was put on it, so `high` was missing
    until a first batch or priority job), ordered by model, then high, normal, low."""
    every = {queue_model(name) or "" for name in depths} | set(models)
    order = {priority: rank for rank, priority in enumerate(PRIORITIES)}
    named = {
        keys.generation_queue(model, priority): (model, order[priority])
        for model in every
        for priority in PRIORITIES
    }
    return {name: depths.get(name, 0) for name in sorted(named, key=named.__getitem__)}


async def _worker_models(client: redis.asyncio.Redis) -> dict[str, str]:
    """tokenrelay's live RQ workers: name -> the model of the queues it listens on. A worker
    whose RQ hash expired (it died) or that listens on no queue of ours is left out."""
    prefix = Worker.redis_worker_namespace_prefix
    worker_keys = sorted(cast("set[str]", await client.smembers(Worker.redis_workers_keys)))
    async with client.pipeline(transaction=False) as pipe:
        for key in worker_keys:
            pipe.hget(key, "queues")  # RQ's comma-separated queue names
        listens = await pipe.execute()
    workers: dict[str, str] = {}
    for key, queues in zip(worker_keys, listens, strict=True):
        models = [model for name in (queues or "").split(",") if (model := queue_model(name))]
        if models and key.startswith(prefix):
            workers[key.removeprefix(prefix)] = models[0]
    return workers


async def _registrations(
    client: redis.asyncio.Redis, names: list[str]
) -> dict[str, dict[str, str | None]]:
    """Each worker's own registration (`shared.redis.keys.worker`): model and capacity."""
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hmget(keys.worker(name), _REGISTRATION_FIELDS)
        found = await pipe.execute()
    return {
        name: dict(zip(_REGISTRATION_FIELDS, values, strict=True))
        for name, values in zip(names, found, strict=True)
    }


def _rq_workers(connection: redis.Redis, names: list[str]) -> list[tuple[BaseWorker, list[str]]]:
    """RQ's record of each named worker with the ids of the jobs it executes; a worker that
    is gone by now is left out."""
    found = []
    for name in names:
        worker = Worker.find_by_key(
            Worker.redis_worker_namespace_prefix + name,
            connection=connection,
            serializer=JSONSerializer,
        )
        if worker is not None:
            running = [execution.job_id for execution in worker.get_current_executions()]
            found.append((worker, running))
    return found


def _worker_view(
    worker: BaseWorker, running: list[str], listened: str, registration: dict[str, str | None]
) -> WorkerView:
    """Model and capacity as the worker registered them; until it has, the model its queues
    name and no capacity."""
    capacity = registration["capacity"]
    return WorkerView(
        name=worker.name,
        state=worker.get_state(),
        model=registration["model"] or listened,
        capacity=int(capacity) if capacity is not None else None,
        running=running,
        last_heartbeat=_timestamp(worker.last_heartbeat),
        started_at=_timestamp(worker.birth_date),
        hostname=worker.hostname,
        pid=worker.pid,
        succeeded=worker.successful_job_count,
        failed=worker.failed_job_count,
    )


def _recent_job(job_id: str, fields: dict[str, str | None], now: float) -> RecentJob:
    created = float(fields[JobField.CREATED_AT] or now)
    started = _float(fields[JobField.STARTED_AT])
    finished = _float(fields[JobField.FINISHED_AT])
    completion = _int(fields[JobField.COMPLETION_TOKENS])
    run_s = None if started is None else (finished or now) - started
    tokens_per_s = None
    if completion is not None and run_s:
        tokens_per_s = round(completion / run_s, 2)
    return RecentJob(
        id=job_id,
        status=JobStatus(fields[JobField.STATUS] or JobStatus.QUEUED),
        model=fields[JobField.MODEL] or "",
        worker=fields[JobField.WORKER],
        created_at=created,
        started_at=started,
        finished_at=finished,
        queue_wait_s=_round((started or finished or now) - created),
        run_s=_round(run_s),
        prompt_tokens=_int(fields[JobField.PROMPT_TOKENS]),
        completion_tokens=completion,
        tokens_per_s=tokens_per_s,
        finish_reason=fields[JobField.FINISH_REASON],
        error_type=fields[JobField.ERROR_TYPE],
    )


def _timestamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _float(value: str | None) -> float | None:
    return float(value) if value is not None else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
