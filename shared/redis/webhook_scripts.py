"""The webhook delivery queue's scripts (`shared/redis/lua/webhook_*.lua`), with typed
wrappers; `api.webhooks.queue` runs them (its docstring draws the queue)."""

from __future__ import annotations

from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.scripts import ScriptCall, load, timed

WEBHOOK_TICK = timed("webhook_tick.lua")
WEBHOOK_RESCHEDULE = timed("webhook_reschedule.lua")
WEBHOOK_RELEASE = load("webhook_release.lua")


def tick(dispatcher_id: str, visibility_ms: int, move_batch: int) -> ScriptCall:
    """Heartbeat `dispatcher_id`, move due retries back to the queue and recover the
    deliveries of dispatchers silent for `visibility_ms`; the reply is `{retried, recovered}`."""
    return ScriptCall(
        WEBHOOK_TICK,
        [keys.webhook_deliveries(), keys.webhook_retries(), keys.webhook_dispatchers()],
        [dispatcher_id, visibility_ms, keys.webhook_processing(keys.ID_PLACEHOLDER), move_batch],
    )


def reschedule(dispatcher_id: str, raw: str, delivery: str, delay_ms: int) -> ScriptCall:
    """Move `raw` from the dispatcher's processing list to the retry set as `delivery`, due in
    `delay_ms`; the reply is 1 when it was still held."""
    return ScriptCall(
        WEBHOOK_RESCHEDULE,
        [keys.webhook_processing(dispatcher_id), keys.webhook_retries()],
        [raw, delivery, delay_ms],
    )


def release(dispatcher_id: str) -> ScriptCall:
    """Hand every delivery the dispatcher holds back to the queue and deregister it; the reply
    is how many went back."""
    return ScriptCall(
        WEBHOOK_RELEASE,
        [
            keys.webhook_processing(dispatcher_id),
            keys.webhook_deliveries(),
            keys.webhook_dispatchers(),
        ],
        [dispatcher_id],
    )
