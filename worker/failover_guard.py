"""What keeps a worker from losing a job to a Sentinel failover.

A promoted replica and the old primary both take writes until the sentinels turn the old
one into a replica (seconds). A worker may take a job from the queue just before the
promotion and start it just after: the new primary received the dequeue but not the start,
and would let the job expire while the worker ran it on the old primary, where everything it
wrote is discarded.

- `start_holds`: with `TOKENRELAY_REDIS_MIN_REPLICAS`, a start counts once that many
  replicas acknowledged it (`WAIT`), or once the sentinels still name the server it reached
  as the primary (its replica may just be behind); otherwise the process's clients have
  moved to the new primary, and the runner starts the job again there.
- `give_back`: a job that a worker ran and then found still queued (its end reached the new
  primary) goes back to its queue (`rq_jobs.give_back`).
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from tokenrelay.shared import keys, rq_jobs
from tokenrelay.shared.settings import Settings

REPLICA_WAIT_MS = 1000


class FailoverGuard:
    def __init__(
        self, settings: Settings, client: redis.Redis, primary_moved: Callable[[], bool]
    ) -> None:
        self._wanted = settings.redis_min_replicas
        self._client = client
        self._primary_moved = primary_moved

    def start_holds(self) -> bool:
        """Whether the start this process just applied survives a failover (see above)."""
        if not self._wanted:
            return True
        with self._client.pipeline(transaction=False) as pipe:
            pipe.incr(keys.replication_mark())
            pipe.execute_command("WAIT", self._wanted, REPLICA_WAIT_MS)
            _, acknowledged = pipe.execute()
        return int(acknowledged) >= self._wanted or not self._primary_moved()

    def give_back(self, job_id: str) -> bool:
        return rq_jobs.give_back(self._client, job_id)
