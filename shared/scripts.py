"""Lua scripts over the lease set and the job keys, with typed wrappers.

The sources are files of `shared/lua/`, loaded as package resources and joined here:
`clock.lua` (`now_ms`, the one reader of Redis `TIME`, so the clocks of API nodes and
workers never matter) comes first in every script that reads the time, and the job library
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
twice; the dispatchers in `api.webhooks` send them (`api.webhook_queue` runs the WEBHOOK_*
scripts).

Common arguments of the library scripts (`library.lua`'s header):
    KEYS[1]  the lease set (`shared.keys.leases()`)
    KEYS[#KEYS - 1]  the token plane's outbox (`shared.keys.token_plane_outbox()`)
    KEYS[#KEYS]  the webhook delivery list (`shared.keys.webhook_deliveries()`), always last
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
tokens, so the API process reading it subscribes nothing per job (`api.streams`).

The token plane's scripts (`plane.lua`, then `emit.lua`, `open.lua` or `close.lua`) take
every key in KEYS, one job's (EMIT: several jobs' on a plain Redis), so they run on a Redis
Cluster too; with `TOKENRELAY_STREAM_REDIS_URL` they run on that Redis, the job library's
on the control Redis (`shared.token_plane`).

The wrappers build a `ScriptCall`; the async API and the sync worker each run it on their
own client (`shared.script_runner`) and parse the reply here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from tokenrelay.shared import keys
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
from tokenrelay.shared.settings import Settings

LUA_SOURCES = files("tokenrelay.shared") / "lua"
"""The folder of `.lua` files (a package resource)."""


def _source(*names: str) -> str:
    """The named files of `LUA_SOURCES`, joined in order into one script."""
    return "\n".join((LUA_SOURCES / name).read_text(encoding="utf-8") for name in names)


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


def library_bindings() -> str:
    """The Lua locals the job library uses, from Python's names: each of `LIBRARY_NAMES` as
    `F_<JobField name>` or `S_<JobStatus name>`, and `SCRIPT_ERRORS` (`_ERRORS`). Compiled
    into the script rather than sent with every call (bench/README.md, "Ninth pass")."""
    fields = set(JobField)
    lines = ["-- The job library's names (`shared.scripts.library_bindings`)."]
    for name in LIBRARY_NAMES:
        var = f"F_{JobField(name).name}" if name in fields else f"S_{JobStatus(name).name}"
        lines.append(f"local {var} = {_lua_string(name)}")
    lines.append(f"local SCRIPT_ERRORS = {_lua_string(_ERRORS)}")
    return "\n".join(lines)


def _job_script(name: str) -> str:
    """A script built on the job library: the clock, the token plane's library (the job
    library uses it where one Redis serves both planes), the job library's names and the
    library, then the script."""
    return "\n".join(
        (_source("clock.lua", "plane.lua"), library_bindings(), _source("library.lua", name))
    )


def _plane_script(name: str) -> str:
    """A token-plane script: the token plane's library, then the script."""
    return _source("plane.lua", name)


def _timed_script(name: str) -> str:
    """A script that reads the time but ends no job: the clock, then the script."""
    return _source("clock.lua", name)


ADMIT = _job_script("admit.lua")
START = _job_script("start.lua")
EMIT = _plane_script("emit.lua")
OPEN = _plane_script("open.lua")
CLOSE = _plane_script("close.lua")
FINISH = _job_script("finish.lua")
CANCEL = _job_script("cancel.lua")
REAP = _job_script("reap.lua")
RENEW = _timed_script("renew.lua")
REGISTER_WORKER = _timed_script("register_worker.lua")
LIVE_MODELS = _timed_script("live_models.lua")
WEBHOOK_TICK = _timed_script("webhook_tick.lua")
WEBHOOK_RESCHEDULE = _timed_script("webhook_reschedule.lua")
WEBHOOK_RELEASE = _source("webhook_release.lua")

LIBRARY_ARGC = 7
"""How many ARGV the job library takes before a script's own."""

_REAP_BATCH = 100
BATCH_LINE_DEFERRED = "batch_line_deferred"
"""What a batch line's refused admission counts under: it waits for spare capacity, and no
client was refused."""
RECENT_JOBS_KEPT = 50

Arg = str | int | float | bytes


@dataclass(frozen=True)
class Enqueue:
    """An admitted job's queue entry, written by ADMIT in the same script: `fields` (name,
    value pairs) in the hash `record_key` with a TTL of `ttl_s`, `queue_key` in the set
    `queues_key`, the job id at the queue's end. `shared.rq_jobs.queued_job` builds RQ's."""

    queues_key: str
    queue_key: str
    record_key: str
    fields: tuple[Arg, ...]
    ttl_s: int


@dataclass(frozen=True)
class ScriptCall:
    """One script invocation, ready for a sync or async Redis client."""

    source: str
    keys: list[str]
    args: list[Arg]


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
    extra = [part for pair in (job_fields or {}).items() for part in pair]
    queue_keys: tuple[str, ...] = ()
    queue_args: list[Arg] = [""]
    if enqueue is not None:
        queue_keys = (enqueue.queues_key, enqueue.queue_key, enqueue.record_key)
        queue_args = [enqueue.ttl_s, *enqueue.fields]
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


def start(settings: Settings, job_id: str, worker: str, started_event: str) -> ScriptCall:
    return _library_call(START, settings, job_id, worker, settings.lease_ttl_ms, started_event)


EmitItem = tuple[str, int, str]
"""One event for EMIT: job id, seq (numbered by the job's worker), event JSON."""


def publish_command(settings: Settings) -> str:
    """How token-plane scripts publish: sharded pub/sub on a Redis Cluster."""
    return "SPUBLISH" if settings.stream_redis_cluster else "PUBLISH"


def reader_channel(settings: Settings, reader: str | None) -> str | None:
    """Where EMIT publishes the token events of a job that API process `reader` reads: its
    channel (`keys.reader_channel`); None, the job's own channel, for a job without a
    reader and on a Redis Cluster (a script's keys and shard channels share one slot)."""
    if reader is None or settings.stream_redis_cluster:
        return None
    return keys.reader_channel(reader)


def emit(
    settings: Settings,
    events: list[EmitItem],
    reader_channels: Mapping[str, str] | None = None,
) -> ScriptCall:
    """Append events of several jobs in one round trip, on the token plane (see `emit.lua`);
    on a Redis Cluster the events of one job only. A job in `reader_channels` (job id: its
    `reader_channel`) has its events published there, with the call's other events for
    that channel in one message, not on its own channel."""
    reader_channels = reader_channels or {}
    if reader_channels and settings.stream_redis_cluster:
        raise ValueError("EMIT publishes on reader channels on a plain Redis only")
    groups: dict[str, list[EmitItem]] = {}  # reader channel ('' for none): its events
    for item in events:
        groups.setdefault(reader_channels.get(item[0]) or "", []).append(item)
    trims = any(seq >= settings.event_log_maxlen for _, seq, _ in events)
    script_keys: list[str] = []
    args: list[Arg] = [
        settings.event_log_maxlen if trims else "",
        publish_command(settings),
        len(groups),
    ]
    for channel, items in sorted(groups.items()):  # the jobs' own channels first
        args += [channel, len(items)]
        for job_id, seq, event in items:
            script_keys.append(keys.job_events(job_id))
            if not channel:
                script_keys.append(keys.job_channel(job_id))
            args += [job_id, f"1-{seq}", log_payload(seq, event)]
    return ScriptCall(EMIT, script_keys, args)


def log_payload(seq: int, event: str) -> str:
    """An event's JSON (without seq) as its job's log holds it, with its seq first, as
    `plane.lua`'s `log_payload` writes it: EMIT's events arrive so, keeping the string
    building per token off Redis."""
    return f'{{"seq":{seq},{event[1:]}'


def _log_keys(job_id: str) -> tuple[str, str]:
    return keys.job_events(job_id), keys.job_channel(job_id)


def open_log(settings: Settings, job_id: str, started_event: str) -> ScriptCall:
    """Start a job's log on a token plane of its own with its Started event (see `open.lua`)."""
    header: list[Arg] = [settings.event_log_maxlen, publish_command(settings)]
    return ScriptCall(OPEN, [*_log_keys(job_id)], [*header, started_event])


def close_log(
    settings: Settings,
    job_id: str,
    final_event: str,
    final_seq: int = -1,
    text: str | None = None,
) -> ScriptCall:
    """Close a job's log on a token plane of its own with its final event, only at
    `final_seq` when that is >= 0; store `text` when given (see `close.lua`)."""
    args: list[Arg] = [
        settings.event_log_maxlen,
        publish_command(settings),
        settings.result_ttl_s,
        final_event,
        final_seq,
    ]
    if text is not None:
        args.append(text)
    return ScriptCall(CLOSE, [*_log_keys(job_id), keys.job_text(job_id)], args)


@dataclass(frozen=True)
class EmitReply:
    """What an EMIT call found: jobs no longer running, and where logs with a gap must resume."""

    gone: list[str]
    resume_at: dict[str, int]


def parse_emit(reply: list[Any]) -> EmitReply:
    gone, behind = reply
    pairs = zip(behind[::2], behind[1::2], strict=True)
    return EmitReply(
        gone=[str(job_id) for job_id in gone],
        resume_at={str(job_id): int(seq) for job_id, seq in pairs},
    )


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
) -> ScriptCall:
    """End a job; with `final_seq` >= 0, only if its log holds every event below it. `text`,
    the job's whole text, is stored when this call ends it. `unsent` (its worker's events
    Redis has not applied yet, as `JobLog.unacked` lists them) are appended first, each at
    its seq, and published where the job's other events are (its reader's channel, else its
    own), where the token plane is on this Redis."""
    args: list[Arg] = [job_id, status, json.dumps(fields), final_event, final_seq]
    args += ["0", ""] if text is None else ["1", text]
    args += [part for _, seq, event in unsent for part in (seq, event)]
    return _library_call(FINISH, settings, *args)


def cancel(settings: Settings, job_id: str) -> ScriptCall:
    return _library_call(CANCEL, settings, job_id, keys.cancel_channel())


def reap(settings: Settings) -> ScriptCall:
    return _library_call(REAP, settings, _REAP_BATCH)


def renew(settings: Settings, job_ids: list[str]) -> ScriptCall:
    script_keys = [keys.leases(), *(keys.job(job_id) for job_id in job_ids)]
    return ScriptCall(
        RENEW,
        script_keys,
        [
            settings.lease_ttl_ms,
            JobField.STATUS,
            JobStatus.RUNNING,
            JobField.CANCEL_REQUESTED,
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


def decode_text(value: bytes | str | None) -> str | None:
    """Script replies arrive as bytes on clients without `decode_responses`."""
    if isinstance(value, bytes):
        return value.decode()
    return value


def register_worker(settings: Settings, name: str, model: str, capacity: int) -> ScriptCall:
    ttl_ms = settings.lease_ttl_ms
    script_keys = [keys.models(), keys.worker(name)]
    return ScriptCall(REGISTER_WORKER, script_keys, [model, capacity, ttl_ms])


def live_models() -> ScriptCall:
    return ScriptCall(LIVE_MODELS, [keys.models()], [])
