"""OpenAI's Responses API (`api.responses`): create, poll or resume, cancel, delete, and a
stored response's input items."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import MODEL_ERRORS, RESPONSE_ERRORS, SUBMIT_ERRORS
from tokenrelay.api.responses import create, lifecycle, store
from tokenrelay.api.responses.input_items import page
from tokenrelay.api.responses.objects import (
    DeletedResponse,
    InputItemList,
    InputTokens,
    ResponseObject,
)
from tokenrelay.api.responses.retrieve import current, resume
from tokenrelay.api.responses.schema import ResponseRequest
from tokenrelay.api.streaming import sse
from tokenrelay.shared.errors import InvalidRequest

router = APIRouter(prefix="/v1/responses", tags=["responses"], responses=RESPONSE_ERRORS)

COUNT_ERRORS = {**MODEL_ERRORS, 400: SUBMIT_ERRORS[400]}
_STREAM = {"text/event-stream": {"schema": {"type": "string"}}}


@router.post(
    "",
    response_model=ResponseObject,
    responses={**SUBMIT_ERRORS, 200: {"content": _STREAM, "description": "The response"}},
)
async def create_response(
    body: ResponseRequest, state: StateDep, caller: CallerDep, http: Request
) -> Response:
    """Generate a response: one object, or (`stream`) OpenAI's numbered stream events. A
    `background` response is answered at once and runs on without a listener."""
    return await create.create(state, caller, body, http.receive)


@router.post("/input_tokens", responses=COUNT_ERRORS)
async def count_input_tokens(
    body: ResponseRequest, state: StateDep, caller: CallerDep
) -> InputTokens:
    """The prompt's tokens, chat template included, as the response's
    `usage.input_tokens` will say (before any truncation)."""
    return InputTokens(input_tokens=await create.count_input_tokens(state, caller, body))


@router.get(
    "/{response_id}",
    response_model=ResponseObject,
    responses={200: {"content": _STREAM, "description": "The response, or its stream"}},
)
async def retrieve_response(
    response_id: str,
    state: StateDep,
    caller: CallerDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    include_obfuscation: bool | None = None,
) -> Any:
    """The response as it stands (a poll); with `stream=true`, its stream events from the
    start or after `starting_after`, then live until it ends, from any API process."""
    stored = await store.load(state, caller, response_id)
    if include_obfuscation:
        raise InvalidRequest(
            "`include_obfuscation` is not supported: tokenrelay pads no stream events",
            param="include_obfuscation",
        )
    if not stream:
        if starting_after is not None:
            raise InvalidRequest("`starting_after` needs `stream=true`", param="starting_after")
        return (await current(state, stored)).model_dump(mode="json")
    after = -1 if starting_after is None else starting_after
    return sse.response(await resume(state, stored, after))


@router.post("/{response_id}/cancel", response_model=ResponseObject)
async def cancel_response(response_id: str, state: StateDep, caller: CallerDep) -> Any:
    """Cancel a `background` response: it ends `cancelled` (a running one at its worker's
    next decoding step)."""
    stored = await store.load(state, caller, response_id)
    return (await lifecycle.cancel(state, stored)).model_dump(mode="json")


@router.delete("/{response_id}")
async def delete_response(response_id: str, state: StateDep, caller: CallerDep) -> DeletedResponse:
    """Forget a stored response (a running one is cancelled)."""
    stored = await store.load(state, caller, response_id)
    await lifecycle.delete(state, stored)
    return DeletedResponse(id=response_id)


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    state: StateDep,
    caller: CallerDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> InputItemList:
    """The response's own input items (not its chain's), paged as OpenAI pages them."""
    stored = await store.load(state, caller, response_id)
    return page(stored.input, after=after, limit=limit, order=order)
