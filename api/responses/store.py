"""Stored responses in Redis: one hash per response (`keys.response`), owned by its API key's
owner and found only by it, kept for `TOKENRELAY_RESPONSES_TTL_S`.

The hash holds what the request fixed (the `ResponseShell`, its input items) and, once the
response ended, its final object. Its output is its job's: a stored response is *settled*
when its job has ended, by whichever API process sees that first (the one streaming it, a
poll, or any process's `settle_forever`): the final object is written into the hash and the
job's records (hash, event log, text) are given the response's own expiry, so a stream can
be resumed from the log, and the object read, for as long as the response is kept. Until
then its id waits in `keys.unsettled_responses()`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from redis.typing import EncodableT, FieldT

from tokenrelay.api.deps import Caller
from tokenrelay.api.responses.objects import ResponseObject, ResponseShell
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import ResponseNotFound
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.rq_jobs import JOB_ID_PATTERN

PREFIX = "resp_"


class ResponseField(StrEnum):
    """The field names of a stored response's hash."""

    OWNER = "owner"
    SHELL = "shell"
    INPUT = "input"
    FINAL = "final"
    #: Unix seconds: when the hash expires, and so the job's records once settled.
    EXPIRES_AT = "expires_at"


@dataclass(frozen=True)
class StoredResponse:
    shell: ResponseShell
    input: list[dict[str, Any]]
    final: ResponseObject | None
    expires_at: int


def job_id_of(response_id: str) -> str | None:
    """The job a response id names (`resp_<job id>`), None for an id that names none."""
    job_id = response_id.removeprefix(PREFIX)
    if job_id == response_id or not JOB_ID_PATTERN.match(job_id):
        return None
    return job_id


async def save(
    state: AppState, owner: str, shell: ResponseShell, items: list[dict[str, Any]]
) -> None:
    """Store a new response and mark it unsettled, in one round trip."""
    expires_at = expiry(state, shell)
    key = keys.response(shell.id)
    fields: dict[FieldT, EncodableT] = {
        ResponseField.OWNER: owner,
        ResponseField.SHELL: shell.model_dump_json(),
        ResponseField.INPUT: _items_json(items),
        ResponseField.EXPIRES_AT: str(expires_at),
    }
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=fields)
        pipe.expireat(key, expires_at)
        pipe.zadd(keys.unsettled_responses(), {shell.id: int(shell.created_at * 1000)})
        await pipe.execute()


async def load(state: AppState, caller: Caller, response_id: str) -> StoredResponse:
    """The caller's stored response; `ResponseNotFound` (404) for an unknown id, another
    key's, an expired one and one created with `store: false` alike."""
    found = await load_any(state, response_id)
    if found is None or not caller.owns(found[0]):
        raise ResponseNotFound(
            f"`response_id`: no response {response_id!r} (unknown, expired, another API key's, "
            "or created with `store: false`)",
            param="response_id",
        )
    return found[1]


async def load_any(state: AppState, response_id: str) -> tuple[str, StoredResponse] | None:
    """A stored response whoever owns it, with its owner; None when there is none."""
    if job_id_of(response_id) is None:
        return None
    fields = cast("dict[str, str]", await state.redis.hgetall(keys.response(response_id)))
    if ResponseField.SHELL not in fields or ResponseField.OWNER not in fields:
        return None
    final = fields.get(ResponseField.FINAL)
    stored = StoredResponse(
        shell=ResponseShell.model_validate_json(fields[ResponseField.SHELL]),
        input=_items(fields.get(ResponseField.INPUT, "[]")),
        final=None if final is None else ResponseObject.model_validate_json(final),
        expires_at=int(fields.get(ResponseField.EXPIRES_AT, "0")),
    )
    return fields[ResponseField.OWNER], stored


async def settle(
    state: AppState, shell: ResponseShell, final: ResponseObject, expires_at: int
) -> None:
    """Write the ended response's object, and keep its job's records until `expires_at`
    (the response's own expiry)."""
    response_key = keys.response(shell.id)
    job_id = shell.job_id
    async with state.redis.pipeline(transaction=True) as pipe:
        # A response deleted meanwhile gets back only this field, which expires with it and
        # which no read sees (it has no owner).
        pipe.hset(response_key, ResponseField.FINAL, final.model_dump_json())
        pipe.expireat(response_key, expires_at)
        pipe.expireat(keys.job(job_id), expires_at)
        pipe.zrem(keys.unsettled_responses(), shell.id)
        if state.plane is state.redis:
            pipe.expireat(keys.job_events(job_id), expires_at)
            pipe.expireat(keys.job_text(job_id), expires_at)
        await pipe.execute()
    if state.plane is not state.redis:
        await state.plane.expireat(keys.job_events(job_id), expires_at)
        await state.plane.expireat(keys.job_text(job_id), expires_at)


def expiry(state: AppState, shell: ResponseShell) -> int:
    """When a response created now is forgotten (Unix seconds)."""
    return int(shell.created_at) + state.settings.responses_ttl_s


async def delete(state: AppState, response_id: str, job_id: str, *, job_ended: bool) -> None:
    """Delete the response, and its job's records if the job has ended (a running job is
    cancelled by the caller first; its records then expire as any job's)."""
    async with state.redis.pipeline(transaction=True) as pipe:
        pipe.delete(keys.response(response_id))
        pipe.zrem(keys.unsettled_responses(), response_id)
        if job_ended:
            pipe.delete(keys.job(job_id))
        await pipe.execute()
    if job_ended:
        await state.plane.delete(keys.job_events(job_id), keys.job_text(job_id))


async def unsettled(state: AppState, count: int) -> list[str]:
    """The ids of the `count` oldest unsettled responses."""
    return cast("list[str]", await state.redis.zrange(keys.unsettled_responses(), 0, count - 1))


async def forget_unsettled(state: AppState, response_id: str) -> None:
    """Drop an unsettled id whose response is gone (deleted, or past its retention)."""
    await state.redis.zrem(keys.unsettled_responses(), response_id)


def _items_json(items: list[dict[str, Any]]) -> str:
    return json.dumps(items, ensure_ascii=False, separators=(",", ":"))


def _items(text: str) -> list[dict[str, Any]]:
    value: list[dict[str, Any]] = json.loads(text)
    return value
