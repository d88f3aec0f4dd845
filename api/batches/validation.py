"""A batch's `validating` step: read its input file line by line from Redis (never whole),
check every line as its endpoint would, and store the valid requests for the feeder.

The batch fails with OpenAI's `errors` list (code, message, param, line) if any line is
bad: invalid JSON, a `custom_id` missing or repeated, a method other than POST, a `url` other
than the batch's endpoint, a body its endpoint refuses, or a model no worker ever served.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

from redis.typing import EncodableT, FieldT

from tokenrelay.api.batches.lines import LineError, generation, parse_line
from tokenrelay.api.batches.models import BatchErrorItem, BatchErrors
from tokenrelay.api.files import store as file_store
from tokenrelay.api.jobs.model_routing import check_model
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import ModelNotFound
from tokenrelay.shared.redis import keys

MAX_ERRORS = 100  # reported in `errors`; the batch fails with the first bad line counted
WRITE_EVERY = 500


async def file_lines(state: AppState, file_id: str) -> AsyncIterator[bytes]:
    """The file's non-empty lines, read chunk by chunk."""
    rest = b""
    async for chunk in file_store.iter_content(state, file_id):
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if rest.strip():
        yield rest


async def validate(
    state: AppState,
    batch_id: str,
    file_id: str,
    endpoint: str,
    keep_alive: Callable[[], Awaitable[None]],
) -> tuple[int, BatchErrors | None]:
    """Check every line; store the requests of a valid file in `keys.batch_requests`.
    Returns the number of requests and None, or 0 and the errors. `keep_alive` is awaited
    every `WRITE_EVERY` lines (the feeder renews its lease on the batch)."""
    errors: list[BatchErrorItem] = []
    seen: set[str] = set()
    models: dict[str, bool] = {}
    pending: dict[str, str] = {}
    count = 0
    async for raw in file_lines(state, file_id):
        count += 1
        try:
            custom_id, body = parse_line(raw, endpoint)
            if custom_id in seen:
                raise LineError(
                    "duplicate_custom_id", f"`custom_id` {custom_id!r} is repeated", "custom_id"
                )
            seen.add(custom_id)
            request = generation(body, endpoint, state.settings)
            if request.model not in models:
                models[request.model] = await _model_known(state, request.model)
            if not models[request.model]:
                raise LineError(
                    "model_not_found", f"no worker serves the model {request.model!r}", "body.model"
                )
        except LineError as exc:
            if len(errors) < MAX_ERRORS:
                errors.append(
                    BatchErrorItem(code=exc.code, message=exc.message, param=exc.param, line=count)
                )
            continue
        if not errors:
            pending[str(count - 1)] = json.dumps({"custom_id": custom_id, "body": body})
        if len(pending) >= WRITE_EVERY:
            await _store(state, batch_id, pending)
            await keep_alive()
    if not count:
        errors.append(BatchErrorItem(code="empty_file", message="the input file has no requests"))
    if errors:
        await state.redis.delete(keys.batch_requests(batch_id))
        return 0, BatchErrors(data=errors)
    await _store(state, batch_id, pending)
    return count, None


async def _store(state: AppState, batch_id: str, pending: dict[str, str]) -> None:
    if pending:
        mapping: dict[FieldT, EncodableT] = {line: text for line, text in pending.items()}
        await state.redis.hset(keys.batch_requests(batch_id), mapping=mapping)
        pending.clear()


async def _model_known(state: AppState, model: str) -> bool:
    try:
        await check_model(state, model)
    except ModelNotFound:
        return False
    return True
