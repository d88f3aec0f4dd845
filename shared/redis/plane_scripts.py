"""The token plane's scripts: a job's event log (a bounded Redis Stream) and its channel,
with typed wrappers.

Each is `plane.lua` (the token plane's library: `log_payload`, appending at a seq,
publishing), then `emit.lua`, `open.lua` or `close.lua`. They take every key in KEYS, one
job's (EMIT: several jobs' on a plain Redis), so they run on a Redis Cluster too; with
`TOKENRELAY_STREAM_REDIS_URL` they run on that Redis, the job library's on the control Redis
(`shared.redis.token_plane`). The event's wire format is described once, in
docs/internals/wire-format.md.

HOT PATH: EMIT carries every token event (docs/architecture.md, "The per-token path"):
measure with `python -m bench.probes.redis_emit` and `python -m bench.gateway` before and
after changing it or `emit.lua`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.scripts import Arg, ScriptCall, load
from tokenrelay.shared.settings import Settings


def _plane_script(name: str) -> str:
    """A token-plane script: the token plane's library, then the script."""
    return load("plane.lua", name)


EMIT = _plane_script("emit.lua")
OPEN = _plane_script("open.lua")
CLOSE = _plane_script("close.lua")


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
