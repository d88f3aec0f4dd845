"""One running batch, as its feeder sees it each tick: collect the results of its lines'
jobs, admit more lines, stop the rest when it is cancelled or expires.

Every line's state is in Redis, so whichever feeder holds the batch next carries on:
a line at or past `next_line` has not been reached; `pending[i]` is `""` for a line waiting
for (re)admission, or the id of the job that runs it; `results[i]` is its one result
(written by `batch_result.lua`, which also drops it from `pending`). A line's job ids are
`<batch id>-<line>-<random>`, never reused (not even after a Redis restart that lost the
last second of writes), so a retried line's new job cannot overwrite an old one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from tokenrelay.api.batches.lines import LineError, failed_line, generation, output_line, unrun_line
from tokenrelay.api.batches.models import BatchField
from tokenrelay.api.deps import Caller
from tokenrelay.api.jobs.control import cancel, submit
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import (
    InvalidRequest,
    Overloaded,
    QuotaExceeded,
    RedisUnavailable,
    WorkerLost,
)
from tokenrelay.shared.jobs import JobRecord, JobStatus
from tokenrelay.shared.redis import batch_scripts, keys

#: Job errors after which a line runs again (up to `TOKENRELAY_BATCH_LINE_MAX_ATTEMPTS`):
#: the job was lost, not answered.
RETRIED_ERRORS = frozenset({WorkerLost.error_type, RedisUnavailable.error_type})
OUTPUT, ERROR = "o", "e"  # the prefix of a stored result: which file its line goes to
STOP_CODES = {"cancel": "batch_cancelled", "expire": "batch_expired"}
STOP_MESSAGES = {
    "cancel": "the batch was cancelled before this request completed",
    "expire": "the batch's completion window ran out before this request completed",
}


@dataclass
class BatchRun:
    batch_id: str
    fields: dict[str, str]
    pending: dict[str, str]
    #: Called with a line's outcome once its result is written (a metrics counter).
    on_result: Callable[[str], None]
    waiting: list[int] = field(default_factory=list)

    @property
    def owner(self) -> str:
        return self.fields[BatchField.OWNER]

    @property
    def endpoint(self) -> str:
        return self.fields[BatchField.ENDPOINT]

    @property
    def total(self) -> int:
        return int(self.fields.get(BatchField.TOTAL, 0))

    @property
    def next_line(self) -> int:
        return int(self.fields.get(BatchField.NEXT_LINE, 0))

    @property
    def stop(self) -> str | None:
        return self.fields.get(BatchField.STOP)

    @property
    def running_jobs(self) -> dict[int, str]:
        return {int(line): job for line, job in self.pending.items() if job}

    def has_work(self) -> bool:
        return self.stop is None and (bool(self.waiting) or self.next_line < self.total)


async def load(
    state: AppState, batch_id: str, fields: dict[str, str], on_result: Callable[[str], None]
) -> BatchRun:
    pending = cast("dict[str, str]", await state.redis.hgetall(keys.batch_pending(batch_id)))
    run = BatchRun(batch_id, fields, pending, on_result)
    run.waiting = sorted(int(line) for line, job in pending.items() if not job)
    return run


async def record_result(state: AppState, run: BatchRun, line: int, kind: str, text: str) -> None:
    count_field = BatchField.COMPLETED if kind == OUTPUT else BatchField.FAILED
    call = batch_scripts.result(run.batch_id, line, kind + text, count_field)
    if await state.scripts.run(call):
        run.on_result(_outcome(run, kind))
    run.pending.pop(str(line), None)


def _outcome(run: BatchRun, kind: str) -> str:
    if kind == OUTPUT:
        return "completed"
    return {"cancel": "cancelled", "expire": "expired"}.get(run.stop or "", "failed")


async def _custom_ids(state: AppState, run: BatchRun, lines: list[int]) -> dict[int, str]:
    if not lines:
        return {}
    raw = await state.redis.hmget(keys.batch_requests(run.batch_id), [str(n) for n in lines])
    return {
        line: json.loads(item)["custom_id"] if item else str(line)
        for line, item in zip(lines, raw, strict=True)
    }


async def collect(state: AppState, run: BatchRun) -> None:
    """Write the result of every line whose job ended; put lost or queue-expired ones back
    to wait for another job; ask the jobs of a stopping batch to stop."""
    jobs = run.running_jobs
    if not jobs:
        return
    async with state.redis.pipeline(transaction=False) as pipe:
        for job_id in jobs.values():
            pipe.hgetall(keys.job(job_id))
        hashes = await pipe.execute()
    async with state.plane.pipeline(transaction=False) as plane_pipe:
        for job_id in jobs.values():
            plane_pipe.get(keys.job_text(job_id))
        texts = await plane_pipe.execute()
    ids = await _custom_ids(state, run, list(jobs))
    for (line, job_id), fields, text in zip(jobs.items(), hashes, texts, strict=True):
        if not fields:
            await _wait_again(state, run, line)
            continue
        record = JobRecord.from_redis(job_id, fields, text or "")
        if not record.status.is_terminal:
            if run.stop is not None:
                await cancel(state, job_id)
            continue
        await _settle(state, run, line, ids[line], record)


async def _settle(
    state: AppState, run: BatchRun, line: int, custom_id: str, record: JobRecord
) -> None:
    status, error = record.status, record.error
    if status == JobStatus.SUCCEEDED:
        text = output_line(custom_id, run.endpoint, record.model, record)
        await record_result(state, run, line, OUTPUT, text)
    elif run.stop is not None and status in (JobStatus.CANCELLED, JobStatus.EXPIRED):
        text = unrun_line(record.id, custom_id, STOP_CODES[run.stop], STOP_MESSAGES[run.stop])
        await record_result(state, run, line, ERROR, text)
    elif status == JobStatus.EXPIRED:
        await _wait_again(state, run, line)  # waited in the queue too long: not its fault
    elif error is not None and error.type in RETRIED_ERRORS and await _may_retry(state, run, line):
        await _wait_again(state, run, line)
    else:
        await record_result(state, run, line, ERROR, failed_line(custom_id, record))


async def _may_retry(state: AppState, run: BatchRun, line: int) -> bool:
    losses = await state.redis.hincrby(keys.batch_attempts(run.batch_id), f"{line}:lost", 1)
    return int(losses) < state.settings.batch_line_max_attempts


async def _wait_again(state: AppState, run: BatchRun, line: int) -> None:
    await state.redis.hset(keys.batch_pending(run.batch_id), str(line), "")
    run.pending[str(line)] = ""
    run.waiting.append(line)


async def admit_next(state: AppState, run: BatchRun) -> bool:
    """Admit the run's next line; False when there is no room for batch lines now."""
    new = not run.waiting
    line = run.next_line if new else run.waiting.pop(0)
    job_id = f"{run.batch_id}-{line}-{uuid.uuid4().hex[:12]}"
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch_pending(run.batch_id), str(line), job_id)
        if new:
            pipe.hset(keys.batch(run.batch_id), BatchField.NEXT_LINE, line + 1)
        await pipe.execute()
    run.pending[str(line)] = job_id
    if new:
        run.fields[BatchField.NEXT_LINE] = str(line + 1)
    raw = await state.redis.hget(keys.batch_requests(run.batch_id), str(line))
    request = json.loads(raw or "{}")
    custom_id = request.get("custom_id", str(line))
    try:
        job = generation(request["body"], run.endpoint, state.settings)
        await submit(state, Caller(owner=run.owner), job, "low", batch_job_id=job_id)
    except (Overloaded, QuotaExceeded):
        await _wait_again(state, run, line)
        run.waiting.sort()
        return False
    except (LineError, InvalidRequest) as exc:
        error = exc if isinstance(exc, InvalidRequest) else InvalidRequest(exc.message)
        response = {"status_code": 400, "request_id": job_id, "body": error.body()}
        text = json.dumps(
            {
                "id": f"batch_req_{job_id}",
                "custom_id": custom_id,
                "response": response,
                "error": None,
            },
            separators=(",", ":"),
        )
        await record_result(state, run, line, ERROR, text)
    except RedisUnavailable:
        pass  # the job was ended failed; `collect` retries it
    return True


async def stop_unstarted(state: AppState, run: BatchRun) -> None:
    """A stopping batch: every line never handed to a job gets its error line now."""
    assert run.stop is not None
    code, message = STOP_CODES[run.stop], STOP_MESSAGES[run.stop]
    waiting = set(run.waiting)
    lines = sorted(waiting) + list(range(run.next_line, run.total))
    for start in range(0, len(lines), 500):
        part = lines[start : start + 500]
        ids = await _custom_ids(state, run, part)
        for line in part:
            line_id = f"{run.batch_id}-{line}"
            await record_result(
                state, run, line, ERROR, unrun_line(line_id, ids[line], code, message)
            )
    run.waiting.clear()
    if run.next_line < run.total:
        await state.redis.hset(keys.batch(run.batch_id), BatchField.NEXT_LINE, run.total)
        run.fields[BatchField.NEXT_LINE] = str(run.total)


def expired(run: BatchRun) -> bool:
    return time.time() >= int(run.fields.get("expires_at", 0))
