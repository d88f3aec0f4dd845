"""Submit, look up and cancel jobs: admission + enqueue, owner checks, cancellation."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from redis.exceptions import RedisError

from tokenrelay.api.deps import Caller
from tokenrelay.api.jobs.record import read_job
from tokenrelay.api.middleware import request_log
from tokenrelay.api.state import AppState
from tokenrelay.api.webhooks.policy import WebhookTarget
from tokenrelay.shared.errors import JobNotFound, RedisUnavailable
from tokenrelay.shared.events import Error
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.jobs import JobField, JobRecord, JobStatus, error_fields
from tokenrelay.shared.redis import job_scripts, keys, scripts
from tokenrelay.shared.redis.replies import as_text
from tokenrelay.shared.redis.rq_jobs import (
    JOB_ID_PATTERN,
    Priority,
    fail_lost_jobs,
    queued_job,
    remove_queued,
)
from tokenrelay.shared.redis.token_plane import drain_outbox

log = logging.getLogger(__name__)

REPLICA_WAIT_TIMEOUT_MS = 1000


async def _wait_for_replicas(state: AppState, moves: int) -> None:
    """Return once `TOKENRELAY_REDIS_MIN_REPLICAS` replicas hold this admission's writes.

    WAIT covers the writes of its own connection: a write on the same connection just
    before it, after the admission's writes (ADMIT, with the webhook fields and the queue
    entry) had completed, stands for them (replication is one ordered stream), as long as
    they reached its server. They may run on another connection: `moves` is the connector's
    count of primary moves before ADMIT, and an admission across a move is refused (ADMIT
    may have reached the old primary, and the new one's replicas acknowledge only what the
    new one took)."""
    wanted = state.settings.redis_min_replicas
    async with state.redis.pipeline(transaction=False) as pipe:
        pipe.incr(keys.replication_mark())
        pipe.execute_command("WAIT", wanted, REPLICA_WAIT_TIMEOUT_MS)
        _, acknowledged = await pipe.execute()
    if int(acknowledged) < wanted:
        raise RedisUnavailable(
            f"only {acknowledged} of {wanted} Redis replicas acknowledged the admission "
            f"within {REPLICA_WAIT_TIMEOUT_MS} ms"
        )
    if state.connector.primary_moves() != moves:
        raise RedisUnavailable("the Redis primary changed during the admission")


async def submit(
    state: AppState,
    caller: Caller,
    request: GenerationRequest,
    priority: Priority | None = None,
    webhook: WebhookTarget | None = None,
    *,
    batch_job_id: str | None = None,
    read_here: bool = False,
) -> str:
    """Admit and enqueue a job at `priority` (else the caller's key's default); raises
    `ContextLengthExceeded` for a request that can never fit a worker, `QuotaExceeded` or
    `Overloaded` when the key's or the global limit is reached. A batch line comes with
    its own unique id (`batch_job_id`) and is admitted as one (`job_scripts.admit`). A job this
    process reads (`read_here`) names it as its reader: its events are published on this
    process's channel (`StreamHub.reader_id`), where the hub listens anyway, and the hub
    hears them from before the admission (`StreamHub.expect`). The job goes to the queue of
    the worker likely to hold its prompt's longest prefix where there is one
    (`api.jobs.placement`), else to its model's."""
    job_id = batch_job_id or uuid.uuid4().hex
    settings = state.settings
    reader = state.hub.reader_id if read_here else None
    job_fields = {} if webhook is None else dict(webhook.hash_fields())
    if reader is not None:
        job_fields[JobField.READER] = reader
    request_log.note_generation(caller.owner, request)
    truncating = request.truncating(state.settings.truncate_messages)
    await state.prompt_fit.check(request, truncating=truncating)
    worker = await state.placement.choose(request)
    moves = state.connector.primary_moves()
    admit = job_scripts.admit(
        settings,
        job_id,
        caller.owner,
        request.model,
        caller.max_inflight,
        batch_line=batch_job_id is not None,
        enqueue=queued_job(
            state.rq_connection,
            settings,
            job_id,
            request,
            priority or caller.priority,
            reader,
            worker,
        ),
        job_fields=job_fields,
    )
    if reader is not None:
        state.hub.expect(job_id)  # heard from before its admission: no log to replay
    try:
        await _run_admission(state, job_id, admit, moves)
    except BaseException:
        state.hub.forget(job_id)
        raise
    return job_id


async def _run_admission(
    state: AppState, job_id: str, admit: scripts.ScriptCall, moves: int
) -> None:
    """Run ADMIT; raises if the job was refused or its admission is not safe."""
    settings = state.settings
    try:
        reply = await state.scripts.run(admit)
    except RedisError:
        # Redis may have run ADMIT and lost only its reply: the job would then be queued
        # for a client that got a 503 (and may send it again). End it, if it is there.
        await cancel_quietly(state, job_id)
        raise
    if lost := job_scripts.reaped_by_admission(reply):
        state.spawn(
            asyncio.to_thread(fail_lost_jobs, state.rq_connection, lost, settings.result_ttl_s)
        )
    job_scripts.check_admitted(reply)
    request_log.note_job(job_id)
    if settings.redis_min_replicas:
        try:
            await _wait_for_replicas(state, moves)
        except Exception as exc:
            log.warning("admission of job %s not held by replicas: %s", job_id, exc)
            error = Error(
                error_type=RedisUnavailable.error_type, message="the job could not be enqueued"
            )
            fields = error_fields(error)
            finish = job_scripts.finish(
                settings, job_id, JobStatus.FAILED, dict(fields), error.to_wire()
            )
            await state.scripts.run(finish)
            await drain_outbox(state.redis, state.plane_scripts, settings)
            raise RedisUnavailable("the job could not be enqueued; retry shortly") from exc


async def owned_job(state: AppState, caller: Caller, job_id: str) -> tuple[dict[str, str], str]:
    """The job's hash fields and text (`read_job`); 404 for unknown ids and for jobs of
    another caller alike."""
    request_log.note_job(job_id, caller.owner)
    if not JOB_ID_PATTERN.match(job_id):
        raise JobNotFound(f"no job {job_id!r}")
    fields, text = await read_job(state.redis, state.plane, job_id)
    if not fields or not caller.owns(fields.get(JobField.OWNER)):
        raise JobNotFound(f"no job {job_id!r}")
    return fields, text


async def get_record(state: AppState, caller: Caller, job_id: str) -> JobRecord:
    """The job's record; 404 for unknown ids and for jobs of another caller alike."""
    return JobRecord.from_redis(job_id, *await owned_job(state, caller, job_id))


async def cancel(state: AppState, job_id: str) -> str | None:
    """Cancel a job: a queued one ends now, a running one stops at its next decoding step."""
    outcome = await state.scripts.run(job_scripts.cancel(state.settings, job_id))
    if outcome == JobStatus.CANCELLED:
        await drain_outbox(state.redis, state.plane_scripts, state.settings)
        await asyncio.to_thread(remove_queued, state.rq_connection, job_id)
    return as_text(outcome)


async def cancel_quietly(state: AppState, job_id: str) -> None:
    """Cancel on client disconnect, or after an admission whose reply was lost: best
    effort, never raises (the lease reaps the rest)."""
    try:
        await cancel(state, job_id)
    except Exception as exc:
        log.warning("cancel of job %s failed: %s", job_id, exc)


def cancel_on_leave(state: AppState, job_id: str) -> Callable[[], None]:
    """What a stream does when its client leaves before the end: cancel the job, in the
    background (`relay`'s and `first_output`'s `on_leave`)."""
    return lambda: state.spawn(cancel_quietly(state, job_id))
