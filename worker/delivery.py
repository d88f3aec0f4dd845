"""Events of running jobs on their way to Redis: numbered here, kept until the job ends.

A worker is the only writer of a job it runs (START made it the owner; besides it only the
lease reaper ends the job, once the lease expired), so it numbers the job's events itself:
seq 0 is START's `Started`, then 1, 2, ... A `JobLog` keeps every event of its job, sent or
not: Redis with `appendfsync everysec` can come back from a crash without its last second of
writes, so an acknowledged event may have to be sent again. EMIT applies only a job's next
seq (a resend is a no-op; a gap is refused with the seq to resume from), and the worker's
FINISH ends the job only when its log holds every event (`shared/redis/lua/emit.lua`, `finish.lua`);
where one Redis holds both planes, FINISH carries the job's unsent events (its last chunk)
and applies them the same way.

`Courier` sends the unacknowledged events of many jobs in one EMIT call, on the token plane's
Redis (on a Redis Cluster one call per job: a script's keys must share a slot); a failed call
is tried again after `worker.retry.Backoff`'s wait.

HOT PATH (docs/architecture.md, "The per-token path"): measure with
`python -m bench.worker_throughput` before and after changing it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from tokenrelay.shared.redis import plane_scripts
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.active_jobs import ActiveJobs, StopReason

log = logging.getLogger(__name__)

FIRST_SEQ = 1
"""The seq of a job's first event after START's `Started` (seq 0)."""


@dataclass(eq=False)
class JobLog:
    """One running job's events from `first_seq` on; Redis holds every seq below `acked`.

    A continuation (the job's earlier worker was lost: docs/operations/failure-behaviour.md)
    numbers its events from the seq after its own Started event, and its text begins with
    the text the earlier attempts delivered (`prior_text`)."""

    job_id: str
    #: Where its token events go, if not on its own channel (`plane_scripts.reader_channel`).
    reader_channel: str | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    first_seq: int = FIRST_SEQ
    prior_text: str = ""
    acked: int = FIRST_SEQ

    def __post_init__(self) -> None:
        self.acked = max(self.acked, self.first_seq)

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.events)

    @property
    def complete(self) -> bool:
        return self.acked == self.next_seq

    def add(self, event: str, text: str) -> None:
        """Number an event (JSON without seq) and the text it appends to the job's text."""
        self.events.append((event, text))

    @property
    def text(self) -> str:
        """The job's text: every event's, in order, after the earlier attempts' (FINISH
        stores it)."""
        return self.prior_text + "".join(text for _, text in self.events)

    def unacked(self) -> list[plane_scripts.EmitItem]:
        return [
            (self.job_id, seq, self.events[seq - self.first_seq][0])
            for seq in range(self.acked, self.next_seq)
        ]

    def resend_all(self) -> None:
        """Redis lost some acknowledged events: send them all again (EMIT skips the rest)."""
        self.acked = self.first_seq


class Courier:
    """Sends jobs' unacknowledged events in one EMIT call and applies what Redis answered;
    `redis_scripts` runs on the token plane's Redis."""

    def __init__(self, redis_scripts: SyncScripts, settings: Settings, active: ActiveJobs) -> None:
        self._scripts = redis_scripts
        self._settings = settings
        self._active = active

    def send(self, logs: list[JobLog]) -> bool:
        """Send every unacknowledged event of `logs`; False after a Redis error (they stay
        unacknowledged, for the next try)."""
        sent = {job_log.job_id: job_log.next_seq for job_log in logs}
        if self._settings.stream_redis_cluster:  # a script's keys share one slot: one job's
            batches = [items for job_log in logs if (items := job_log.unacked())]
        else:
            batches = [[item for job_log in logs for item in job_log.unacked()]]
        if not any(batches):
            return True
        channels = {log.job_id: log.reader_channel for log in logs if log.reader_channel}
        replies: list[plane_scripts.EmitReply] = []
        try:
            for items in batches:
                reply = self._scripts.run(plane_scripts.emit(self._settings, items, channels))
                replies.append(plane_scripts.parse_emit(reply))
        except RedisError as exc:
            count = sum(len(items) for items in batches)
            log.warning("could not send %d events, will retry: %s", count, exc)
            return False
        resume_at = {job_id: seq for reply in replies for job_id, seq in reply.resume_at.items()}
        for job_log in logs:
            job_log.acked = resume_at.get(job_log.job_id, sent[job_log.job_id])
        for job_id in (job_id for reply in replies for job_id in reply.gone):
            self._active.request_stop(job_id, StopReason.LEASE_LOST)
        return True
