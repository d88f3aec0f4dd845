"""A batch's end: its results become the output and error files (one line per request, in
input order), the batch takes its terminal status, and its working keys go."""

from __future__ import annotations

import time
from typing import cast

from redis.typing import EncodableT, FieldT

from tokenrelay.api.batches.models import BatchField, BatchStatus
from tokenrelay.api.batches.run import ERROR, OUTPUT
from tokenrelay.api.batches.store import batch_keys, transition
from tokenrelay.api.files.store import FileWriter, remove_file
from tokenrelay.api.state import AppState
from tokenrelay.shared.redis import keys

READ_EVERY = 500

#: The terminal status a batch ends in, by why it stopped (no stop: every line ran).
ENDINGS = {
    None: (BatchStatus.FINALIZING, BatchStatus.COMPLETED, "completed_at"),
    "cancel": (BatchStatus.CANCELLING, BatchStatus.CANCELLED, "cancelled_at"),
    "expire": (BatchStatus.IN_PROGRESS, BatchStatus.EXPIRED, "expired_at"),
}


async def finalize(state: AppState, batch_id: str, fields: dict[str, str]) -> bool:
    """Write the files and end the batch; False if a concurrent transition (a cancel)
    came first, in which case the next tick ends it that way."""
    stop = fields.get(BatchField.STOP)
    source, target, stamp = ENDINGS[stop]
    if stop is None and fields[BatchField.STATUS] == BatchStatus.IN_PROGRESS:
        moved = await transition(
            state,
            batch_id,
            (BatchStatus.IN_PROGRESS,),
            BatchStatus.FINALIZING,
            {"finalizing_at": int(time.time())},
        )
        if not moved:
            return False
    owner, total = fields[BatchField.OWNER], int(fields.get(BatchField.TOTAL, 0))
    file_ids = await _write_files(state, batch_id, owner, total)
    sources = (source, BatchStatus.CANCELLING) if stop == "expire" else (source,)
    done = await transition(state, batch_id, sources, target, {stamp: int(time.time()), **file_ids})
    if done:
        await retire(state, batch_id)
    else:  # another finalizer ended it, with files of its own: these would be orphans
        for file_id in file_ids.values():
            await remove_file(state.redis, owner, str(file_id))
    return done


async def _write_files(
    state: AppState, batch_id: str, owner: str, total: int
) -> dict[FieldT, EncodableT]:
    writers = {OUTPUT: FileWriter(state), ERROR: FileWriter(state)}
    results = keys.batch_results(batch_id)
    for start in range(0, total, READ_EVERY):
        lines = [str(n) for n in range(start, min(total, start + READ_EVERY))]
        values = cast("list[str | None]", await state.redis.hmget(results, lines))
        for value in values:
            if value:
                await writers[value[0]].write(value[1:].encode() + b"\n")
    file_ids: dict[FieldT, EncodableT] = {}
    retention_s = state.settings.file_retention_s
    for kind, field, suffix in (
        (OUTPUT, BatchField.OUTPUT_FILE_ID, "output"),
        (ERROR, BatchField.ERROR_FILE_ID, "error"),
    ):
        writer = writers[kind]
        if writer.size:
            item = await writer.commit(
                owner, f"{batch_id}_{suffix}.jsonl", "batch_output", retention_s
            )
            file_ids[field] = item.id
    return file_ids


async def retire(state: AppState, batch_id: str) -> None:
    """The ended batch leaves the active set; its working keys go, its record stays as long
    as its files. Idempotent: whoever finds a batch ended, and still active, retires it."""
    hash_key, *working = batch_keys(batch_id)
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.zrem(keys.active_batches(), batch_id)
        pipe.delete(*working)
        pipe.expire(hash_key, state.settings.file_retention_s)
        await pipe.execute()
