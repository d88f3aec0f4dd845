"""OpenAI's Batch API: a JSONL file of requests run at the lowest priority on spare capacity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tokenrelay.api.batches import store as batch_store
from tokenrelay.api.batches.models import Batch, BatchCreate, BatchList
from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import BATCH_ERRORS

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=BATCH_ERRORS)


@router.post("")
async def create_batch(body: BatchCreate, state: StateDep, caller: CallerDep) -> Batch:
    """Create a batch from an uploaded file (`purpose=batch`); it starts `validating`. With
    tokenrelay's `webhook`, the batch object is POSTed there, signed, once it ends."""
    return await batch_store.create_batch(state, caller, body)


@router.get("")
async def list_batches(
    state: StateDep,
    caller: CallerDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """The caller's batches, newest first, paged by `after`/`limit`."""
    return await batch_store.list_batches(state, caller, after=after, limit=limit)


@router.get("/{batch_id}")
async def retrieve_batch(batch_id: str, state: StateDep, caller: CallerDep) -> Batch:
    """Status, live `request_counts`, timestamps and, once it ended, its files."""
    return await batch_store.get_batch(state, caller, batch_id)


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, state: StateDep, caller: CallerDep) -> Batch:
    """Cancel: queued lines end at once, running ones at their next decoding step; the
    batch is `cancelling` until they have, then `cancelled` with its files."""
    return await batch_store.request_cancel(state, caller, batch_id)
