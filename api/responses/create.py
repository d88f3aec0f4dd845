"""`POST /v1/responses`: a job admitted, queued, run and streamed exactly as a chat
completion's (`submit`, `first_output`, `relay`, `collect`), rendered as a response.

A response in the foreground is read here (this process is its job's reader): streamed, its
client leaving cancels it, as a chat stream's does; or collected into one object. A
`background` one is submitted to run without a listener (as `POST /v1/jobs` does): answered
at once, its events stay in the job's log for any API process to stream, resume or poll. A
stored response (the default) is written to Redis before its answer starts, and settled
when it ends (`store`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from tokenrelay.api.deps import Caller
from tokenrelay.api.jobs.control import cancel_on_leave, cancel_quietly, submit
from tokenrelay.api.jobs.model_routing import check_model
from tokenrelay.api.jobs.tool_parser import parser_name
from tokenrelay.api.openai.field_support import no_effect_header
from tokenrelay.api.responses import chain, conversation, store
from tokenrelay.api.responses.events import ResponseEvents
from tokenrelay.api.responses.items import stored_items
from tokenrelay.api.responses.objects import Echo, ResponseObject, ResponseShell
from tokenrelay.api.responses.render import ResponseSSE
from tokenrelay.api.responses.schema import ResponseRequest
from tokenrelay.api.state import AppState
from tokenrelay.api.streaming import job_events as hub_events
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.first_output import first_output
from tokenrelay.api.streaming.relay import collect, relay
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.generation import GenerationRequest

T = TypeVar("T")


async def prepare(
    state: AppState, caller: Caller, body: ResponseRequest
) -> tuple[GenerationRequest, conversation.Plan]:
    """The generation `body` asks for, its chain's items first, and its rendering plan."""
    await check_model(state, body.model)
    history = []
    if body.previous_response_id is not None:
        history = await chain.history(state, caller, body.previous_response_id)
    return conversation.build(body, history, state.settings)


async def count_input_tokens(state: AppState, caller: Caller, body: ResponseRequest) -> int:
    """`POST /v1/responses/input_tokens`: the prompt's tokens as the worker counts them,
    chat template included, which a response's `usage.input_tokens` will say."""
    generation, _ = await prepare(state, caller, body)
    try:
        return await state.prompt_fit.count(generation)
    except InvalidRequest as exc:
        raise type(exc)(exc.message, param="input") from None


async def create(
    state: AppState, caller: Caller, body: ResponseRequest, receive: Receive
) -> Response:
    if body.in_background and not body.stored:
        raise InvalidRequest(
            "`background` needs `store`: a background response is read back from the store",
            param="store",
        )
    generation, plan = await prepare(state, caller, body)
    if plan.parse_calls:
        plan = plan.model_copy(update={"parser": await parser_name(state, body.model)})
    try:
        job_id = await submit(
            state, caller, generation, body.priority, read_here=not body.in_background
        )
    except InvalidRequest as exc:  # the prompt over the context window: `messages` is `input`
        raise type(exc)(
            exc.message, param="input" if exc.param == "messages" else exc.param
        ) from None
    shell = ResponseShell(
        id=f"{store.PREFIX}{job_id}",
        job_id=job_id,
        created_at=time.time(),
        echo=Echo.of(body),
        plan=plan,
    )
    record = _Record(state, caller.owner, shell, body)
    headers = no_effect_header(conversation.no_effect_fields(body))
    render = ResponseSSE(ResponseEvents(shell), record.on_final)
    if body.in_background:
        await record.written()
        if not body.stream:
            queued = shell.object("queued", [])
            return JSONResponse(queued.model_dump(mode="json"), headers=headers)
        stream = relay(hub_events.job_events(state, job_id, reader=None), render)
    elif body.stream:
        leave = cancel_on_leave(state, job_id)
        events = await record.alongside(first_output(state, job_id, receive, leave))
        stream = relay(events, render, on_leave=leave)
    else:
        result = await record.alongside(collect(state, job_id))
        built = ResponseEvents(shell, emit=False)
        built.started()
        built.text(result.text, result.logprobs)
        built.done(result.done)
        assert built.final is not None
        await record.settle(built.final)
        return JSONResponse(built.final.model_dump(mode="json"), headers=headers)
    response = sse.response(stream)
    response.headers.update(headers)
    return response


class _Record:
    """A stored response's record, written while its job starts (off the path to its first
    token), and settled when it ends; nothing for `store: false`. The answer starts only
    once the record is written, so any process finds the response from then on."""

    def __init__(
        self, state: AppState, owner: str, shell: ResponseShell, body: ResponseRequest
    ) -> None:
        self._state = state
        self._shell = shell
        self._expires_at = store.expiry(state, shell)
        self._saving: asyncio.Future[None] | None = None
        if body.stored:
            items = stored_items(body.input_items(), shell.job_id)
            self._saving = asyncio.ensure_future(store.save(state, owner, shell, items))

    async def alongside(self, work: Awaitable[T]) -> T:
        """`work`'s result, once the record is written too."""
        try:
            result = await work
        except BaseException:
            if self._saving is not None:
                self._saving.cancel()
            raise
        await self.written()
        return result

    async def written(self) -> None:
        """Wait for the record; a job whose record cannot be written is cancelled."""
        if self._saving is None:
            return
        try:
            await self._saving
        except BaseException:
            await cancel_quietly(self._state, self._shell.job_id)
            raise

    def on_final(self, final: ResponseObject) -> None:
        """Settle the record in the background once the stream has rendered the end."""
        if self._saving is not None:
            self._state.spawn(self.settle(final))

    async def settle(self, final: ResponseObject) -> None:
        if self._saving is not None:
            await store.settle(self._state, self._shell, final, self._expires_at)
