"""Async jobs: submit now, poll or stream later, cancel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.responses import StreamingResponse

from api import sse
from api.deps import CallerDep, StateDep
from api.error_docs import JOB_ERRORS, SUBMIT_ERRORS
from api.job_control import cancel, get_record, submit
from api.job_request import JobRequest
from api.model_routing import check_model
from api.state import AppState
from api.streams import Heartbeat
from shared.errors import InvalidRequest, RedisUnavailable
from shared.jobs import JobRecord

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=JOB_ERRORS)


@router.post("", status_code=202, response_model=JobRecord, responses=SUBMIT_ERRORS)
async def create_job(body: JobRequest, state: StateDep, caller: CallerDep) -> JSONResponse:
    """Admit and enqueue a generation; poll `Location` or stream `Location/events`."""
    await check_model(state, body.model)
    generation = body.to_generation(state.settings)
    webhook = body.webhook_target(state.settings)
    job_id = await submit(state, caller, generation, body.priority, webhook=webhook)
    record = await get_record(state, caller, job_id)
    return JSONResponse(
        record.model_dump(mode="json"), status_code=202, headers={"Location": f"/v1/jobs/{job_id}"}
    )


@router.get("/{job_id}")
async def read_job(job_id: str, state: StateDep, caller: CallerDep) -> JobRecord:
    return await get_record(state, caller, job_id)


@router.delete("/{job_id}")
async def cancel_job(job_id: str, state: StateDep, caller: CallerDep) -> JobRecord:
    """Cancel: a queued job ends at once; a running one stops at its next decoding step."""
    await get_record(state, caller, job_id)
    await cancel(state, job_id)
    return await get_record(state, caller, job_id)


@router.get("/{job_id}/events", response_model=None)
async def job_events(
    job_id: str,
    state: StateDep,
    caller: CallerDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """SSE of the job's events from the start (or after `Last-Event-ID`), through the last."""
    await get_record(state, caller, job_id)
    after_seq = _parse_last_event_id(last_event_id)
    return sse.response(_events(state, job_id, after_seq))


_MAX_SEQ = 2**63 - 1  # event `seq`s are Redis integers; the log is read from `seq + 1`


def _parse_last_event_id(value: str | None) -> int:
    if value is None or value == "":
        return -1
    digits = value.isascii() and value.isdigit() and len(value) <= len(str(_MAX_SEQ))
    if not (digits and int(value) < _MAX_SEQ):
        raise InvalidRequest(
            f"`Last-Event-ID` must be a non-negative integer, got {value[:40]!r}",
            param="Last-Event-ID",
        )
    return int(value)


async def _events(state: AppState, job_id: str, after_seq: int) -> AsyncIterator[bytes]:
    try:
        async for event in state.hub.events(
            job_id, after_seq=after_seq, idle_s=state.settings.sse_ping_s
        ):
            if isinstance(event, Heartbeat):
                yield sse.comment()
            else:
                yield sse.encode(event.model_dump_json(), event=event.type, event_id=event.seq)
    except RedisError:
        error = RedisUnavailable("lost Redis while streaming; reconnect with Last-Event-ID")
        yield sse.encode(json.dumps(error.body()), event="error")
