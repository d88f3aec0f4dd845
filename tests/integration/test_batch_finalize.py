"""A batch's end, in-process on a real Redis: a finalizer that loses the race to end the
batch leaves no files behind (they would be listed to the batch's owner, and never used)."""

from __future__ import annotations

import json

import redis

from tokenrelay.api.app import build_state
from tokenrelay.api.batches.finalize import finalize
from tokenrelay.api.batches.models import BatchField, BatchStatus
from tokenrelay.api.batches.run import ERROR, OUTPUT
from tokenrelay.shared.redis import keys
from tokenrelay.shared.settings import Settings


async def test_a_finalizer_that_loses_the_race_removes_its_files(redis_url: str) -> None:
    state = build_state(Settings(redis_url=redis_url))
    batch_id, owner = "batch_raced", "owner-a"
    finalizing = {
        BatchField.STATUS: BatchStatus.FINALIZING,
        BatchField.OWNER: owner,
        BatchField.TOTAL: "2",
    }
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        sync.hset(keys.batch(batch_id), mapping={**finalizing, BatchField.STATUS: "completed"})
        results = {"0": OUTPUT + json.dumps({"custom_id": "a"}), "1": ERROR + json.dumps({})}
        sync.hset(keys.batch_results(batch_id), mapping=results)
        # Read as `finalizing` by this finalizer; another one completed the batch meanwhile.
        assert not await finalize(state, batch_id, dict(finalizing))
        assert sync.zcard(keys.owner_files(owner)) == 0
        assert list(sync.scan_iter(match=keys.file("*"))) == []
        assert sync.hget(keys.batch(batch_id), BatchField.OUTPUT_FILE_ID) is None
    finally:
        sync.close()
        await state.close()
