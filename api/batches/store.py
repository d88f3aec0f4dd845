"""Batches in Redis: create, look up (owner-checked), list, ask to cancel.

A batch is one hash (`keys.batch`) in an owner index (`keys.owner_batches`) and, until it
ends, in the active set the feeders claim it from (`keys.active_batches`, `api.batches.feeder`).
Its records live as long as its files: `TOKENRELAY_FILE_RETENTION_S` after it ends.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import cast

import redis.asyncio
from redis.exceptions import WatchError
from redis.typing import EncodableT, FieldT

from tokenrelay.api.batches.models import Batch, BatchCreate, BatchField, BatchList, BatchStatus
from tokenrelay.api.deps import Caller
from tokenrelay.api.files import store as file_store
from tokenrelay.api.owned_records import OwnedRecords
from tokenrelay.api.state import AppState
from tokenrelay.api.webhooks.dispatcher import PayloadGone
from tokenrelay.api.webhooks.policy import check_submitted_url
from tokenrelay.api.webhooks.queue import Delivery
from tokenrelay.shared.errors import BatchNotFound, InvalidRequest
from tokenrelay.shared.redis import keys

BATCH_ID_PATTERN = re.compile(r"^batch_[0-9a-f]{32}$")
BATCHES = OwnedRecords("batch", BATCH_ID_PATTERN, keys.batch, BatchNotFound, BatchField.OWNER)


def batch_keys(batch_id: str) -> tuple[str, ...]:
    """Every key of one batch, the hash first."""
    return (
        keys.batch(batch_id),
        keys.batch_requests(batch_id),
        keys.batch_pending(batch_id),
        keys.batch_results(batch_id),
        keys.batch_attempts(batch_id),
    )


async def create_batch(state: AppState, caller: Caller, body: BatchCreate) -> Batch:
    """Record a batch as `validating`; a feeder validates and runs it (`api.batches.feeder`)."""
    if body.webhook is not None:
        check_submitted_url(state.settings, body.webhook)
    item = await file_store.get_file(state.redis, caller, body.input_file_id)
    if item.purpose != "batch":
        raise InvalidRequest(
            f"the file {item.id!r} has purpose {item.purpose!r}, not `batch`",
            param="input_file_id",
        )
    batch_id = f"batch_{uuid.uuid4().hex}"
    now = int(time.time())
    fields: dict[FieldT, EncodableT] = {
        BatchField.OWNER: caller.owner,
        BatchField.STATUS: BatchStatus.VALIDATING,
        BatchField.ENDPOINT: body.endpoint,
        BatchField.INPUT_FILE_ID: body.input_file_id,
        BatchField.TOTAL: 0,
        BatchField.COMPLETED: 0,
        BatchField.FAILED: 0,
        BatchField.NEXT_LINE: 0,
        "created_at": now,
        "expires_at": now + int(state.settings.batch_completion_window_s),
    }
    if body.metadata is not None:
        fields[BatchField.METADATA] = json.dumps(body.metadata)
    if body.webhook is not None:
        fields[BatchField.WEBHOOK] = body.webhook
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch(batch_id), mapping=fields)
        pipe.zadd(keys.owner_batches(caller.owner), {batch_id: time.time() * 1000})
        pipe.zadd(keys.active_batches(), {batch_id: 0})
        await pipe.execute()
    state.batch_created.set()
    return await get_batch(state, caller, batch_id)


async def get_batch(state: AppState, caller: Caller, batch_id: str) -> Batch:
    """The caller's batch; 404 for an unknown id and another key's batch alike."""
    return Batch.from_redis(batch_id, await BATCHES.fields(state.redis, caller, batch_id))


async def list_batches(
    state: AppState, caller: Caller, *, after: str | None, limit: int
) -> BatchList:
    """One page of the caller's batches, newest first."""
    index = keys.owner_batches(caller.owner)
    ids = cast("list[str]", await state.redis.zrevrange(index, 0, -1))
    if after is not None:
        ids = ids[ids.index(after) + 1 :] if after in ids else []
    found: list[Batch] = []
    for batch_id in ids[: limit + 1]:
        fields = cast("dict[str, str]", await state.redis.hgetall(keys.batch(batch_id)))
        if not fields:
            await state.redis.zrem(index, batch_id)
            continue
        found.append(Batch.from_redis(batch_id, fields))
    has_more = len(found) > limit
    found = found[:limit]
    return BatchList(
        data=found,
        first_id=found[0].id if found else None,
        last_id=found[-1].id if found else None,
        has_more=has_more,
    )


async def request_cancel(state: AppState, caller: Caller, batch_id: str) -> Batch:
    """Mark an unfinished batch `cancelling`; its feeder cancels its jobs and ends it."""
    await get_batch(state, caller, batch_id)
    stamp: dict[FieldT, EncodableT] = {
        BatchField.STOP: "cancel",
        "cancelling_at": int(time.time()),
    }
    unfinished = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
    await transition(state, batch_id, unfinished, BatchStatus.CANCELLING, stamp)
    return await get_batch(state, caller, batch_id)


async def transition(
    state: AppState,
    batch_id: str,
    sources: tuple[BatchStatus, ...],
    target: BatchStatus,
    fields: dict[FieldT, EncodableT] | None = None,
) -> bool:
    """Move the batch to `target` (with `fields`) only if its status is one of `sources`,
    atomically (WATCH): the feeder and a cancel never overwrite each other's transition.

    A move to a terminal status queues the batch's webhook delivery, if it has a webhook, in
    the same transaction: no terminal status is ever a source, so of any processes racing to
    end a batch exactly one succeeds, and only its delivery is queued."""
    key = keys.batch(batch_id)
    mapping: dict[FieldT, EncodableT] = {BatchField.STATUS: target, **(fields or {})}
    async with state.redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(key)
                status, webhook = await pipe.hmget(key, [BatchField.STATUS, BatchField.WEBHOOK])
                if status not in sources:
                    await pipe.unwatch()
                    return False
                pipe.multi()
                pipe.hset(key, mapping=mapping)
                if target.is_terminal and webhook:
                    delivery = Delivery(batch_id, "completed", kind="batch")
                    pipe.lpush(keys.webhook_deliveries(), delivery.to_json())
                await pipe.execute()
                return True
            except WatchError:
                continue


async def batch_webhook(client: redis.asyncio.Redis, batch_id: str) -> tuple[str, str]:
    """A batch's webhook URL and body (its batch object), for the webhook dispatcher."""
    fields = cast("dict[str, str]", await client.hgetall(keys.batch(batch_id)))
    url = fields.get(BatchField.WEBHOOK)
    if not url or BatchField.STATUS not in fields:
        raise PayloadGone("the batch's record has expired or has no webhook")
    try:
        return url, Batch.from_redis(batch_id, fields).model_dump_json()
    except (KeyError, ValueError) as exc:
        raise PayloadGone(f"the batch's record is incomplete: {exc!r}") from None
