"""The webhook delivery queue in Redis, as one dispatcher sees it: a reliable queue.

    deliveries (list) ──BLMOVE──▶ processing:<dispatcher> (list) ──LREM──▶ done
         ▲                              │ failed: RESCHEDULE (attempt + 1, due = now + backoff)
         │                              ▼
         └──────── TICK (due) ──── retries (sorted set, score = due ms)
         └──────── TICK (heartbeat of <dispatcher> ran out) / RELEASE (it stopped)

The Lua library (`shared.scripts`) pushes new records on the left of `deliveries`; a
dispatcher takes from the right into its own processing list, so a record is always in
exactly one of the lists or the retry set, whichever process dies when. Dispatchers register
with a heartbeat in `keys.webhook_dispatchers()` (score = expiry, ms) before they take
anything; the processing list of one whose heartbeat expired is handed back to the queue by
the next `TICK` of any other. Time comes from Redis (`TIME`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis.asyncio

from shared import keys
from shared.script_runner import AsyncScripts
from shared.scripts import ScriptCall

MOVE_BATCH = 100

TICK = r"""
-- KEYS[1] the delivery queue, KEYS[2] the retry set, KEYS[3] the dispatcher set.
-- ARGV[1] this dispatcher's id, ARGV[2] visibility timeout (ms), ARGV[3] processing-list key
-- template (`{id}` stands for a dispatcher id), ARGV[4] the most retries and dead dispatchers
-- to handle in one call.
-- Renews this dispatcher's heartbeat, moves due retries to the taking end of the queue, and
-- hands the processing lists of dispatchers whose heartbeat ran out back to the queue.
-- Returns {retries moved, deliveries recovered}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[4])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, max)
for _, record in ipairs(due) do
  redis.call('ZREM', KEYS[2], record)
  redis.call('RPUSH', KEYS[1], record)
end
local recovered = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, max)) do
  local processing = string.gsub(ARGV[3], '{id}', function() return id end)
  while redis.call('LMOVE', processing, KEYS[1], 'LEFT', 'RIGHT') do
    recovered = recovered + 1
  end
  redis.call('ZREM', KEYS[3], id)
end
return {#due, recovered}
"""

RESCHEDULE = r"""
-- KEYS[1] this dispatcher's processing list, KEYS[2] the retry set.
-- ARGV[1] the record as taken, ARGV[2] the record of the next attempt, ARGV[3] delay (ms).
-- Returns 1 when rescheduled; 0 when the record was no longer held here (another dispatcher
-- took this one for dead and handed it back to the queue: it is not scheduled twice).
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
return 1
"""

RELEASE = r"""
-- KEYS[1] this dispatcher's processing list, KEYS[2] the delivery queue,
-- KEYS[3] the dispatcher set. ARGV[1] this dispatcher's id.
-- Hands every delivery still held back to the taking end of the queue and deregisters.
-- Returns how many it handed back.
local moved = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do
  moved = moved + 1
end
redis.call('ZREM', KEYS[3], ARGV[1])
return moved
"""


@dataclass(frozen=True)
class Delivery:
    """One queued webhook delivery: which job, which event, how many attempts failed so far."""

    job_id: str
    event: str
    attempt: int = 0

    @classmethod
    def parse(cls, raw: str) -> Delivery:
        """Read a record as the Lua library writes it; raises `ValueError` if malformed."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"not a delivery record: {raw[:100]!r}")
        job_id, event, attempt = data.get("job_id"), data.get("event"), data.get("attempt")
        if not (isinstance(job_id, str) and isinstance(event, str) and isinstance(attempt, int)):
            raise ValueError(f"not a delivery record: {raw[:100]!r}")
        return cls(job_id=job_id, event=event, attempt=attempt)

    @property
    def message_id(self) -> str:
        """The `webhook-id`: unique per job and event, the same on every attempt."""
        return f"msg_{self.job_id}_{self.event}"

    def next_attempt(self) -> Delivery:
        return Delivery(job_id=self.job_id, event=self.event, attempt=self.attempt + 1)

    def to_json(self) -> str:
        return json.dumps({"job_id": self.job_id, "event": self.event, "attempt": self.attempt})


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
        call = ScriptCall(
            TICK,
            [keys.webhook_deliveries(), keys.webhook_retries(), keys.webhook_dispatchers()],
            [
                self.dispatcher_id,
                self._visibility_ms,
                keys.webhook_processing(keys.ID_PLACEHOLDER),
                MOVE_BATCH,
            ],
        )
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
        call = ScriptCall(
            RESCHEDULE,
            [self.processing, keys.webhook_retries()],
            [raw, delivery.to_json(), int(delay_s * 1000)],
        )
        return bool(await self._scripts.run(call))

    async def release(self) -> int:
        """Hand every held delivery back to the queue and deregister (on shutdown)."""
        call = ScriptCall(
            RELEASE,
            [self.processing, keys.webhook_deliveries(), keys.webhook_dispatchers()],
            [self.dispatcher_id],
        )
        return int(await self._scripts.run(call))
