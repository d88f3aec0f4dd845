"""Anthropic's Messages API (`api.anthropic`): `POST /v1/messages`, streaming or not, and
`POST /v1/messages/count_tokens`.

A message is a job admitted, queued, run and streamed exactly as a chat completion
(`submit`, `first_output`, `relay`, `collect`), from the equivalent chat request; a streaming
client that leaves cancels it. Errors on every path under `/v1/messages` are in Anthropic's
shape (`api.anthropic.errors`). The key comes as `x-api-key` or `Authorization: Bearer`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import JSONResponse, Response

from tokenrelay.api.anthropic.errors import MESSAGES_ERRORS
from tokenrelay.api.anthropic.message import Message, TokenCount
from tokenrelay.api.anthropic.render import MessageSSE, message_of
from tokenrelay.api.anthropic.schema import CountTokensRequest, MessagesRequest
from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.jobs.control import cancel_on_leave, submit
from tokenrelay.api.jobs.model_routing import check_model
from tokenrelay.api.jobs.tool_parser import tool_call_parser
from tokenrelay.api.openai.field_support import NO_EFFECT, SUPPORT_KEY, no_effect_header
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.first_output import first_output
from tokenrelay.api.streaming.relay import collect, relay

router = APIRouter(prefix="/v1/messages", tags=["messages"], responses=MESSAGES_ERRORS)

_NO_EFFECT = {SUPPORT_KEY: NO_EFFECT}
BetaQuery = Annotated[
    bool | None,
    Query(
        description="Accepted, no effect: Anthropic's beta endpoint (Claude Code sends it).",
        json_schema_extra=_NO_EFFECT,
    ),
]
BetaHeader = Annotated[
    str | None,
    Header(
        description="Accepted, no effect: the betas are Anthropic's features of its models.",
        json_schema_extra=_NO_EFFECT,
    ),
]
VersionHeader = Annotated[
    str | None,
    Header(description="Accepted: tokenrelay speaks the Messages API of `2023-06-01`."),
]
_STREAM = {"text/event-stream": {"schema": {"type": "string"}}}


@router.post(
    "",
    response_model=Message,
    responses={200: {"content": _STREAM, "description": "The message, or its stream events"}},
)
async def create_message(
    body: MessagesRequest,
    state: StateDep,
    caller: CallerDep,
    http: Request,
    beta: BetaQuery = None,
    anthropic_beta: BetaHeader = None,
    anthropic_version: VersionHeader = None,
) -> Response:
    """Generate the next assistant message: one `Message`, or (`stream`) Anthropic's events."""
    await check_model(state, body.model)
    chat = body.to_chat()
    generation = chat.to_generation(state.settings)
    parser = await tool_call_parser(state, body.model, chat.tool_selection())
    headers = no_effect_header(body.no_effect_fields() + _betas(beta, anthropic_beta))
    job_id = await submit(state, caller, generation, body.priority, read_here=True)
    if body.stream:
        leave = cancel_on_leave(state, job_id)
        events = await first_output(state, job_id, http.receive, leave)
        render = MessageSSE(job_id, body.model, parser)
        response = sse.response(relay(events, render, on_leave=leave))
        response.headers.update(headers)
        return response
    message = message_of(job_id, body.model, await collect(state, job_id), parser)
    return JSONResponse(message.model_dump(mode="json"), headers=headers)


@router.post("/count_tokens", response_model=TokenCount)
async def count_tokens(
    body: CountTokensRequest,
    state: StateDep,
    _: CallerDep,
    beta: BetaQuery = None,
    anthropic_beta: BetaHeader = None,
    anthropic_version: VersionHeader = None,
) -> Response:
    """The prompt's tokens as the worker will count them (its tokenizer and chat template):
    the reply's `input_tokens` + `cache_read_input_tokens`."""
    await check_model(state, body.model)
    generation = body.to_chat().to_generation(state.settings)
    count = TokenCount(input_tokens=await state.prompt_fit.count(generation))
    headers = no_effect_header(body.no_effect_fields() + _betas(beta, anthropic_beta))
    return JSONResponse(count.model_dump(), headers=headers)


def _betas(beta: bool | None, anthropic_beta: str | None) -> list[str]:
    """The no-effect beta markers a request sent: `?beta=` and `anthropic-beta`."""
    sent = (("beta", beta), ("anthropic-beta", anthropic_beta))
    return [name for name, value in sent if value is not None]
