"""The job library's scripts over the lease set and the job keys, with typed wrappers.

Loaded by `shared.redis.scripts`, after `clock.lua`; the job library
(`library.lua`), after the token plane's (`plane.lua`) and the Python names it uses
(`library_bindings`), follows it in every script that may end a job. The library: `emit`
appends an event at the job's next `seq` to its replay log and publishes it (EMIT instead
applies the seq the running job's worker numbered, so a resend is a no-op); `finish` moves a
job to a terminal state exactly once (a job already terminal is left alone), emits its final
event (or, where the token plane is a Redis of its own, leaves it in the outbox), releases
its lease and puts the result keys on their TTL; `reap` ends jobs whose lease expired;
`webhook` queues a webhook delivery when a job that asked for one (hash fields
`JobField.WEBHOOK`, `JobField.WEBHOOK_EVENTS`) starts (`start`, in START) or ends
(`completed`, in `finish`), in the same script as the transition, so none is lost or made
twice; the dispatchers in `api.webhooks.dispatcher` send them (`shared.redis.webhook_scripts`).

Common arguments of the library scripts (`library.lua`'s header):
    KEYS[1]  the lease set (`shared.redis.keys.leases()`)
    KEYS[#KEYS - 1]  the token plane's outbox (`shared.redis.keys.token_plane_outbox()`)
    KEYS[#KEYS]  the webhook delivery list (`shared.redis.keys.webhook_deliveries()`), always last
    ARGV[1..5]  key templates: job hash, event log, channel, text (`JOB_KEY_TEMPLATES`) and
                a reader's channel (`READER_CHANNEL_TEMPLATE`); the last four empty when the
                token plane is a Redis of its own
    ARGV[6]  event log MAXLEN (approximate)
    ARGV[7]  result TTL in seconds
Script-specific arguments start at ARGV[8] (`LIBRARY_ARGC + 1`); each file's header lists
them. Lua spells no error type, message, job status or job hash field name: the job hash's
field names and job statuses the library uses (`LIBRARY_NAMES`) and the errors the scripts
end jobs with (`shared.errors`) are compiled into each script on the library, as Lua locals
ahead of `library.lua` (`library_bindings`), not sent with every call.
A job with a reader (`JobField.READER`) has the events the library appends (START's
`started`, `finish`'s final one) published on its reader's channel, as EMIT publishes its
tokens, so the API process reading it subscribes nothing per job (`api.streaming.hub`).

The token plane's own scripts (EMIT, OPEN, CLOSE) are `shared.redis.plane_scripts`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rq.job import Job
from rq.job import JobStatus as RQJobStatus
from rq.queue import Queue
from rq.registry import StartedJobRegistry

from tokenrelay.shared.errors import (
    JobCancelled,
    Overloaded,
    QueueWaitExpired,
    QuotaExceeded,
    TokenrelayError,
    WorkerLost,
)
from tokenrelay.shared.events import Error
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.plane_scripts import EmitItem
from tokenrelay.shared.redis.scripts import Arg, ScriptCall, load, timed
from tokenrelay.shared.settings import Settings

LIBRARY_NAMES: tuple[str, ...] = (
    JobField.STATUS,
    JobField.OWNER,
    JobField.OWNER_JOBS,
    JobField.MODEL,
    JobField.WORKER,
    JobField.CREATED_AT,
    JobField.STARTED_AT,
    JobField.FINISHED_AT,
    JobField.CANCEL_REQUESTED,
    JobField.ERROR_TYPE,
    JobField.ERROR_MESSAGE,
    JobField.WEBHOOK,
    JobField.WEBHOOK_EVENTS,
    JobField.READER,
    JobField.ATTEMPT,
    JobField.MAX_ATTEMPTS,
    JobField.REQUEUE_MS,
    JobField.PAST_WORKERS,
    JobField.SEAM_SEQ,
    JobStatus.QUEUED,
    JobStatus.RUNNING,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    JobStatus.EXPIRED,
)
"""The names the job library uses: `F_*` fields and `S_*` statuses (`library_bindings`)."""


def _script_error(error: type[TokenrelayError], message: str) -> dict[str, str]:
    event = Error(error_type=error.error_type, message=message).to_wire()
    return {"type": error.error_type, "message": message, "event": event}


_ERRORS = json.dumps(
    {
        "lease_expired": _script_error(WorkerLost, WorkerLost.LEASE_EXPIRED_MESSAGE),
        "queue_wait_expired": _script_error(QueueWaitExpired, QueueWaitExpired.NOT_STARTED_MESSAGE),
        "cancelled_before_start": _script_error(JobCancelled, JobCancelled.BEFORE_START_MESSAGE),
    }
)
"""The errors the job library ends jobs with, by situation: one JSON string, which Lua
decodes only on the way to ending a job with one."""


def _lua_string(text: str) -> str:
    """`text` as a Lua string literal: printable ASCII as it is, every other byte (and the
    quote and backslash) as a decimal escape."""
    escaped = (
        chr(byte) if 32 <= byte < 127 and byte not in b"'\\" else f"\\{byte:03d}"
        for byte in text.encode()
    )
    return "'" + "".join(escaped) + "'"


_RQ_NAMES = {
    "RQ_JOB_PREFIX": Job.redis_job_namespace_prefix,
    "RQ_QUEUE_PREFIX": Queue.redis_queue_namespace_prefix,
    "RQ_STARTED_PREFIX": StartedJobRegistry.key_template.format(""),
    "RQ_ORIGIN": "origin",
    "RQ_STATUS": "status",
    "RQ_QUEUED": RQJobStatus.QUEUED.value,
}
"""RQ's key prefixes and job hash names that a continuation writes (`continue_job` in
library.lua puts the job's RQ record back at the front of its queue, as `rq_jobs.give_back`
does, and takes the lost worker's execution out of RQ's started registry, whose members are
`<job id>:<execution id>`, so RQ's maintenance never fails the job over it)."""


def library_bindings() -> str:
    """The Lua locals the job library uses, from Python's names: each of `LIBRARY_NAMES` as
    `F_<JobField name>` or `S_<JobStatus name>`, `SCRIPT_ERRORS` (`_ERRORS`), RQ's names
    (`_RQ_NAMES`) and the migrations counter's key. Compiled into the script rather than sent
    with every call: Redis then does no string work for them per call
    (docs/internals/lua.md)."""
    fields = set(JobField)
    lines = ["-- The job library's names (`shared.redis.job_scripts.library_bindings`)."]
    for name in LIBRARY_NAMES:
        var = f"F_{JobField(name).name}" if name in fields else f"S_{JobStatus(name).name}"
        lines.append(f"local {var} = {_lua_string(name)}")
    lines.append(f"local SCRIPT_ERRORS = {_lua_string(_ERRORS)}")
    for var, value in (*_RQ_NAMES.items(), ("MIGRATIONS", keys.migrations())):
        lines.append(f"local {var} = {_lua_string(value)}")
    return "\n".join(lines)


def _job_script(name: str) -> str:
    """A script built on the job library: the clock, the token plane's library (the job
    library uses it where one Redis serves both planes), the job library's names and the
    library, then the script."""
    return "\n".join(
        (load("clock.lua", "plane.lua"), library_bindings(), load("library.lua", name))
    )


ADMIT = _job_script("admit.lua")
START = _job_script("start.lua")
FINISH = _job_script("finish.lua")
CANCEL = _job_script("cancel.lua")
REAP = _job_script("reap.lua")
HANDOVER = _job_script("handover.lua")
RENEW = timed("renew.lua")
REGISTER_WORKER = timed("register_worker.lua")
LIVE_MODELS = timed("live_models.lua")

LIBRARY_ARGC = 7
"""How many ARGV the job library takes before a script's own."""

_REAP_BATCH = 100
BATCH_LINE_DEFERRED = "batch_line_deferred"
"""What a batch line's refused admission counts under: it waits for spare capacity, and no
client was refused."""
RECENT_JOBS_KEPT = 50


@dataclass(frozen=True)
class Enqueue:
    """An admitted job's queue entry, written by ADMIT in the same script: `fields` (name,
    value pairs) in the hash `record_key` with a TTL of `ttl_s`, `queue_key` in the set
    `queues_key`, the job id at the queue's end. `shared.redis.rq_jobs.queued_job` builds RQ's.
    A job placed by prefix names its `worker`, whose queue `worker_queue_key` takes it while
    the worker is listed in `placement_workers_key` (`shared.redis.placement`)."""

    queues_key: str
    queue_key: str
    record_key: str
    fields: tuple[Arg, ...]
    ttl_s: int
    worker: str = ""
    worker_queue_key: str = ""
    placement_workers_key: str = ""


_SEPARATE_PLANE_TEMPLATES = (keys.JOB_KEY_TEMPLATES[0], "", "", "", "")
"""The job library's key templates where the token plane is a Redis of its own."""


def _library_call(
    source: str, settings: Settings, *args: Arg, extra_keys: tuple[str, ...] = ()
) -> ScriptCall:
    templates = _SEPARATE_PLANE_TEMPLATES
    if settings.token_plane_shared:
        templates = (*keys.JOB_KEY_TEMPLATES, keys.READER_CHANNEL_TEMPLATE)
    header: list[Arg] = [*templates, settings.event_log_maxlen, settings.result_ttl_s]
    library_keys = [
        keys.leases(),
        *extra_keys,
        keys.token_plane_outbox(),
        keys.webhook_deliveries(),
    ]
    return ScriptCall(source, library_keys, [*header, *args])


def admit(
    settings: Settings,
    job_id: str,
    owner: str,
    model: str,
    owner_limit: int | None = None,
    *,
    batch_line: bool = False,
    enqueue: Enqueue | None = None,
    job_fields: Mapping[str, str] | None = None,
) -> ScriptCall:
    """Admit an interactive job, whose count leaves batch lines out, or (`batch_line`) a
    batch line: within `TOKENRELAY_BATCH_MAX_INFLIGHT_SHARE` of the limit, counted in the
    set of batch lines instead of its owner's, and only while the whole count is under it.
    An admitted job gets `job_fields` in its hash and, with `enqueue`, its queue entry, in
    the same script: a job is never admitted without them."""
    owner_jobs = keys.batch_lines_inflight() if batch_line else keys.owner_jobs(owner)
    if batch_line:
        owner_limit = settings.batch_max_inflight
    continuation: dict[str, Arg] = {}
    if enqueue is not None:  # a job on an RQ queue can go back to it as a continuation
        continuation = {
            JobField.MAX_ATTEMPTS: settings.job_max_attempts,
            JobField.REQUEUE_MS: settings.max_queue_wait_ms,
        }
    fields = {**continuation, **(job_fields or {})}
    extra = [part for pair in fields.items() for part in pair]
    queue_keys: tuple[str, ...] = ()
    queue_args: list[Arg] = [""]
    if enqueue is not None:
        queue_keys = (enqueue.queues_key, enqueue.queue_key, enqueue.record_key)
        queue_args = [enqueue.ttl_s, *enqueue.fields]
        if enqueue.worker:
            queue_keys += (enqueue.placement_workers_key, enqueue.worker_queue_key)
            queue_args = [enqueue.ttl_s, enqueue.worker, *enqueue.fields]
    return _library_call(
        ADMIT,
        settings,
        job_id,
        settings.max_inflight,
        settings.max_queue_wait_ms,
        owner,
        model,
        _REAP_BATCH,
        RECENT_JOBS_KEPT,
        BATCH_LINE_DEFERRED if batch_line else Overloaded.error_type,
        owner_limit or 0,
        BATCH_LINE_DEFERRED if batch_line else QuotaExceeded.error_type,
        0 if batch_line else 1,
        len(extra) // 2,
        *extra,
        *queue_args,
        extra_keys=(
            keys.recent_jobs(),
            keys.rejections(),
            owner_jobs,
            keys.batch_lines_inflight(),
            *queue_keys,
        ),
    )


def reaped_by_admission(reply: list[Any]) -> list[str]:
    """Running jobs an ADMIT call failed as `WorkerLost` on its way (see `reap`)."""
    return [str(job_id) for job_id in reply[2:]]


def check_admitted(reply: list[Any]) -> int:
    """The in-flight count after admission; raises `QuotaExceeded` when the caller's own
    limit is reached, `Overloaded` when the global one is."""
    admitted, in_flight = int(reply[0]), int(reply[1])
    if admitted < 0:
        raise QuotaExceeded(
            f"this API key already has {in_flight} requests in flight, its limit; retry when "
            "one finishes",
            retry_after_s=1,
        )
    if not admitted:
        raise Overloaded(
            f"tokenrelay is at capacity ({in_flight} requests in flight); retry shortly",
            retry_after_s=1,
        )
    return in_flight


def start(
    settings: Settings,
    job_id: str,
    worker: str,
    started_event: str,
    prefix_index: Sequence[Arg] = (),
) -> ScriptCall:
    """Start a job on `worker`; `prefix_index`, `placement.index_args` of its prompt, records
    the worker as the holder of the prompt's blocks."""
    return _library_call(
        START, settings, job_id, worker, settings.lease_ttl_ms, started_event, *prefix_index
    )


@dataclass(frozen=True)
class StartReply:
    """What START said: the job's status (`running` when this worker now owns it), and for a
    continuation its attempt (2 on) and the events its log held before this start (as the
    log holds them, seq first): what the earlier attempts delivered."""

    status: str | None
    attempt: int = 1
    delivered: tuple[str, ...] = ()


def parse_start(reply: Any) -> StartReply:
    if isinstance(reply, list):
        status, attempt, *delivered = reply
        return StartReply(str(status), int(attempt), tuple(str(event) for event in delivered))
    return StartReply(None if reply is None else str(reply))


FINISH_BEHIND = -1
"""FINISH's (and CLOSE's) reply when the job's log lacks events below the seq its worker
passed."""
FINISH_QUEUED = -2
"""FINISH's reply to a worker when the job is still queued: the worker started it on a
primary whose writes a failover discarded (see `rq_jobs.give_back`)."""


def finish(
    settings: Settings,
    job_id: str,
    status: str,
    fields: dict[str, Arg],
    final_event: str,
    final_seq: int = -1,
    text: str | None = None,
    unsent: Sequence[EmitItem] = (),
    worker: str = "",
) -> ScriptCall:
    """End a job; with `final_seq` >= 0, only if its log holds every event below it. `text`,
    the job's whole text, is stored when this call ends it. `unsent` (its worker's events
    Redis has not applied yet, as `JobLog.unacked` lists them) are appended first, each at
    its seq, and published where the job's other events are (its reader's channel, else its
    own), where the token plane is on this Redis. With `worker`, a running job is ended only
    while that worker runs it (not after a continuation moved it to another)."""
    args: list[Arg] = [job_id, status, json.dumps(fields), final_event, final_seq]
    args += ["0", ""] if text is None else ["1", text]
    args.append(worker)
    args += [part for _, seq, event in unsent for part in (seq, event)]
    return _library_call(FINISH, settings, *args)


def cancel(settings: Settings, job_id: str) -> ScriptCall:
    return _library_call(CANCEL, settings, job_id, keys.cancel_channel())


def reap(settings: Settings) -> ScriptCall:
    return _library_call(REAP, settings, _REAP_BATCH)


def hand_over(settings: Settings, job_id: str, worker: str) -> ScriptCall:
    """Put a job `worker` runs back at the front of its queue as a continuation, if it has
    attempts left: 1 if it did."""
    return _library_call(HANDOVER, settings, job_id, worker)


def renew(settings: Settings, job_ids: list[str], worker: str = "") -> ScriptCall:
    """Renew the leases of `job_ids`; with `worker`, a job another worker runs now (a
    continuation took it over) is reported lost."""
    script_keys = [keys.leases(), *(keys.job(job_id) for job_id in job_ids)]
    return ScriptCall(
        RENEW,
        script_keys,
        [
            settings.lease_ttl_ms,
            JobField.STATUS,
            JobStatus.RUNNING,
            JobField.CANCEL_REQUESTED,
            JobField.WORKER,
            worker,
            *job_ids,
        ],
    )


@dataclass(frozen=True)
class RenewReply:
    """What a RENEW call found: jobs whose lease was lost, jobs asked to stop."""

    lost: list[str]
    cancelled: list[str]


def parse_renew(reply: list[Any]) -> RenewReply:
    lost, cancelled = reply
    return RenewReply(
        lost=[str(job_id) for job_id in lost], cancelled=[str(job_id) for job_id in cancelled]
    )


def register_worker(
    settings: Settings, name: str, model: str, capacity: int, *, placeable: bool = True
) -> ScriptCall:
    """Beat a worker's heartbeat; while `placeable`, list it among the workers jobs are
    placed on by prefix (`shared.redis.placement`)."""
    ttl_ms = settings.lease_ttl_ms
    script_keys = [keys.models(), keys.worker(name), keys.placement_workers(model)]
    args: list[Arg] = [model, capacity, ttl_ms, name, "1" if placeable else "0"]
    return ScriptCall(REGISTER_WORKER, script_keys, args)


def live_models() -> ScriptCall:
    return ScriptCall(LIVE_MODELS, [keys.models()], [])
