"""What keeps a worker from losing a job to a Sentinel failover.

A promoted replica and the old primary both take writes until the sentinels turn the old
one into a replica (seconds). A worker may take a job from the queue just before the
promotion and start it just after, or end a job just after it: the new primary received the
dequeue (or the start) but not what followed, and would let the job expire while the worker
ran it, or after it ended it, on the old primary, where everything it wrote is discarded.

- `apply`: with `TOKENRELAY_REDIS_MIN_REPLICAS`, a worker's START and FINISH count once that
  many replicas acknowledged them (`WAIT`, on the connection that wrote, so it covers the
  write whichever server the process's pools reach by then). Without the acknowledgement the
  write counts only while the sentinels still name the server that took it as the primary,
  `PROMOTION_WINDOW_S` after it (a replica behind, or down). Otherwise the sentinels promoted
  another server, the process's clients move to it, and the runner writes again there: both
  scripts are idempotent.
- `give_back`: a job that a worker ran and then found still queued (its end reached the new
  primary) goes back to its queue (`rq_jobs.give_back`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis

from tokenrelay.shared.redis import keys, rq_jobs
from tokenrelay.shared.redis.connect import Address
from tokenrelay.shared.settings import Settings

REPLICA_WAIT_MS = 1000
PROMOTION_WINDOW_S = 3.0
"""How long after a write no replica acknowledged the sentinels must go on naming its server
as the primary for the write to count: they name a promoted replica about a second after it
took over (their INFO period during a failover), and the write may have reached the old
primary in between."""

T = TypeVar("T")


class FailoverGuard:
    def __init__(
        self, settings: Settings, client: redis.Redis, primary: Callable[[], Address | None]
    ) -> None:
        """`primary` asks the sentinels which server is the primary (None without Sentinel)."""
        self._wanted = settings.redis_min_replicas
        self._client = client
        self._primary = primary

    def apply(
        self, write: Callable[[redis.Redis], T], wrote: Callable[[T], bool]
    ) -> tuple[T, bool]:
        """`write`'s reply on the client, and whether what it wrote survives a failover;
        `wrote` tells from the reply whether it wrote what must survive (a START that found
        the job ended wrote nothing: its reply holds as it is)."""
        if not self._wanted:
            return write(self._client), True
        with self._client.client() as one:
            reply = write(one)
            return reply, not wrote(reply) or self._holds(one)

    def _holds(self, one: redis.Redis) -> bool:
        give_up_at = time.monotonic() + PROMOTION_WINDOW_S
        while True:
            one.incr(keys.replication_mark())  # WAIT then covers every write before it
            if int(one.execute_command("WAIT", self._wanted, REPLICA_WAIT_MS)) >= self._wanted:
                return True
            named = self._primary()
            if named is None:
                return True
            connection = one.connection
            assert connection is not None
            if named != (connection.host, connection.port):
                return False
            if time.monotonic() >= give_up_at:
                return True

    def give_back(self, job_id: str) -> bool:
        return rq_jobs.give_back(self._client, job_id)
