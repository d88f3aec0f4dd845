"""Async jobs: submit now, poll or stream later, cancel."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse
from starlette.responses import StreamingResponse

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import JOB_ERRORS, SUBMIT_ERRORS
from tokenrelay.api.jobs.control import cancel, get_record, owned_job, submit
from tokenrelay.api.jobs.model_routing import check_model
from tokenrelay.api.jobs.request import JobRequest
from tokenrelay.api.streaming import job_events as hub_events
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.hub import Delivery
from tokenrelay.api.streaming.relay import relay
from tokenrelay.shared.errors import ApiShuttingDown, InvalidRequest, RedisUnavailable
from tokenrelay.shared.jobs import JobField, JobRecord

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


@router.get(
    "/{job_id}/events",
    response_model=None,
    responses={204: {"description": "Resumed at or past the job's final event: nothing more"}},
)
async def job_events(
    job_id: str,
    state: StateDep,
    caller: CallerDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse | Response:
    """SSE of the job's events from the start (or after `Last-Event-ID`), through the last.

    A finished job asked to resume at or past its final event answers 204 at once, which
    tells an EventSource to stop reconnecting. The job runs on when the client leaves: it
    was submitted to run without a listener."""
    fields, text = await owned_job(state, caller, job_id)
    record = JobRecord.from_redis(job_id, fields, text)
    after_seq = _parse_last_event_id(last_event_id)
    ended = record.status.is_terminal
    if ended:
        last = await state.hub.last_event(job_id)
        if last is None or last.event.seq <= after_seq:
            return Response(status_code=204)
    reader = fields.get(JobField.READER)
    events = hub_events.job_events(state, job_id, reader=reader, after_seq=after_seq, ended=ended)
    return sse.response(relay(events, _JobEventsSSE()))


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


class _JobEventsSSE:
    """Each event's JSON as the log holds it (never encoded again), its type as the SSE
    `event` and its `seq` as the SSE `id`, which a client resumes from (`Last-Event-ID`)."""

    def start(self) -> None:
        return None

    def event(self, delivery: Delivery) -> bytes:
        event = delivery.event
        return sse.encode(delivery.raw, event=event.type, event_id=event.seq)

    def ping(self) -> bytes:
        return sse.comment()

    def lost_redis(self) -> bytes:
        error = RedisUnavailable("lost Redis while streaming; reconnect with Last-Event-ID")
        return sse.encode(json.dumps(error.body()), event="error")

    def closing(self) -> bytes:
        error = ApiShuttingDown(
            "the API process serving this stream is stopping; the job runs on: reconnect "
            "with Last-Event-ID"
        )
        return sse.encode(json.dumps(error.body()), event="error")

    def end(self) -> None:
        return None
