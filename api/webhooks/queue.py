"""The webhook delivery queue in Redis, as one dispatcher sees it: a reliable queue.

    deliveries (list) ──BLMOVE──▶ processing:<dispatcher> (list) ──LREM──▶ done
         ▲                              │ failed: RESCHEDULE (attempt + 1, due = now + backoff)
         │                              ▼
         └──────── TICK (due) ──── retries (sorted set, score = due ms)
         └──────── TICK (heartbeat of <dispatcher> ran out) / RELEASE (it stopped)

The job library (`shared.redis.job_scripts`) pushes a job's new records on the left of `deliveries`,
`api.batches.store` a batch's, in the transition that ends it; a
dispatcher takes from the right into its own processing list, so a record is always in
exactly one of the lists or the retry set, whichever process dies when. Dispatchers register
with a heartbeat in `keys.webhook_dispatchers()` (score = expiry, ms) before they take
anything; the processing list of one whose heartbeat expired is handed back to the queue by
the next `TICK` of any other. The scripts are `shared.redis.webhook_scripts`; time comes from
Redis (`TIME`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Literal

import redis.asyncio

from tokenrelay.shared.redis import keys, webhook_scripts
from tokenrelay.shared.redis.scripts import AsyncScripts

MOVE_BATCH = 100


@dataclass(frozen=True)
class Delivery:
    """One queued webhook delivery: of which job or batch (`kind`), which event, how many
    attempts failed so far. The record is `{job_id | batch_id, event, attempt}`."""

    subject_id: str
    event: str
    attempt: int = 0
    kind: Literal["job", "batch"] = "job"

    @classmethod
    def parse(cls, raw: str) -> Delivery:
        """Read a record as the Lua library or `api.batches.store` writes it; raises
        `ValueError` if malformed."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"not a delivery record: {raw[:100]!r}")
        job_id, batch_id = data.get("job_id"), data.get("batch_id")
        event, attempt = data.get("event"), data.get("attempt")
        kind: Literal["job", "batch"]
        if isinstance(job_id, str) and batch_id is None:
            subject_id, kind = job_id, "job"
        elif isinstance(batch_id, str) and job_id is None:
            subject_id, kind = batch_id, "batch"
        else:
            raise ValueError(f"not a delivery record: {raw[:100]!r}")
        if not (isinstance(event, str) and isinstance(attempt, int)):
            raise ValueError(f"not a delivery record: {raw[:100]!r}")
        return cls(subject_id=subject_id, event=event, attempt=attempt, kind=kind)

    @property
    def message_id(self) -> str:
        """The `webhook-id`: unique per job or batch and event, the same on every attempt."""
        return f"msg_{self.subject_id}_{self.event}"

    def next_attempt(self) -> Delivery:
        return replace(self, attempt=self.attempt + 1)

    def to_json(self) -> str:
        subject = "job_id" if self.kind == "job" else "batch_id"
        return json.dumps({subject: self.subject_id, "event": self.event, "attempt": self.attempt})


class WebhookQueue:
    """The queue operations of one dispatcher (`dispatcher_id`)."""

    def __init__(
        self, client: redis.asyncio.Redis, dispatcher_id: str, visibility_timeout_s: float
    ) -> None:
        self._redis = client
        self._scripts = AsyncScripts(client)
        self.dispatcher_id = dispatcher_id
        self.processing = keys.webhook_processing(dispatcher_id)
        self._visibility_ms = int(visibility_timeout_s * 1000)

    async def tick(self) -> tuple[int, int]:
        """Heartbeat, due retries back to the queue, dead dispatchers' deliveries recovered."""
        call = webhook_scripts.tick(self.dispatcher_id, self._visibility_ms, MOVE_BATCH)
        retried, recovered = await self._scripts.run(call)
        return int(retried), int(recovered)

    async def take(self, block_s: int) -> str | None:
        """The oldest waiting delivery, moved to this dispatcher's processing list."""
        raw = await self._redis.blmove(
            keys.webhook_deliveries(), self.processing, block_s, "RIGHT", "LEFT"
        )
        return None if raw is None else str(raw)

    async def done(self, raw: str) -> bool:
        """Settle a delivery for good (delivered or given up); False if no longer held."""
        return bool(await self._redis.lrem(self.processing, 1, raw))

    async def retry_later(self, raw: str, delivery: Delivery, delay_s: float) -> bool:
        """Move a failed delivery to the retry set as `delivery`, due in `delay_s`."""
        call = webhook_scripts.reschedule(
            self.dispatcher_id, raw, delivery.to_json(), int(delay_s * 1000)
        )
        return bool(await self._scripts.run(call))

    async def release(self) -> int:
        """Hand every held delivery back to the queue and deregister (on shutdown)."""
        call = webhook_scripts.release(self.dispatcher_id)
        return int(await self._scripts.run(call))
