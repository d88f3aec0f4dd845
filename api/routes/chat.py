"""`POST /v1/chat/completions`: OpenAI-compatible, streaming (SSE) or not."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from redis.exceptions import RedisError
from starlette.responses import StreamingResponse

from api import sse
from api.deps import CallerDep, StateDep
from api.error_docs import SUBMIT_ERRORS
from api.job_control import cancel_quietly, submit
from api.model_routing import check_model
from api.openai_schema import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
)
from api.relay import collect
from api.state import AppState
from api.stream_start import StreamItem, first_output
from api.streams import Heartbeat
from shared.errors import RedisUnavailable, TokenrelayError, from_type
from shared.events import Done, Error, TokenChunk, Usage

router = APIRouter(prefix="/v1", tags=["chat"], responses=SUBMIT_ERRORS)


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, state: StateDep, caller: CallerDep, http: Request
) -> ChatCompletion | StreamingResponse:
    await check_model(state, body.model)
    request = body.to_generation(state.settings)
    job_id = await submit(state, caller, request, body.priority)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = await first_output(state, job_id, http.receive)
        return sse.response(_stream(state, job_id, body.model, include_usage, events))
    return await _complete(state, job_id, body.model)


async def _complete(state: AppState, job_id: str, model: str) -> ChatCompletion:
    text, done = await collect(state, job_id)
    return ChatCompletion(
        id=f"chatcmpl-{job_id}",
        created=int(time.time()),
        model=model,
        choices=[Choice(message=AssistantMessage(content=text), finish_reason=done.finish_reason)],
        usage=done.usage,
    )


async def _stream(
    state: AppState,
    job_id: str,
    model: str,
    include_usage: bool,
    events: AsyncIterator[StreamItem],
) -> AsyncIterator[bytes]:
    chunk = _ChunkWriter(job_id, model)
    ended = False
    try:
        yield chunk.delta(Delta(role="assistant", content=""))
        async for event in events:
            if isinstance(event, TokenChunk):
                yield chunk.content(event.text)
            elif isinstance(event, Done):
                yield chunk.delta(Delta(), finish_reason=event.finish_reason)
                if include_usage:
                    yield chunk.usage(event.usage)
            elif isinstance(event, Error):
                yield _error(from_type(event.error_type, event.message))
            elif isinstance(event, Heartbeat):
                yield sse.comment()
        ended = True
    except RedisError:
        yield _error(RedisUnavailable("lost Redis while streaming; the job may still finish"))
        ended = True
    finally:
        if not ended:
            state.spawn(cancel_quietly(state, job_id))
    yield sse.encode("[DONE]")


def _error(exc: TokenrelayError) -> bytes:
    """An error after the stream started: vLLM's shape, `data: {"error": {...}}`."""
    return sse.encode(json.dumps(exc.body()))


class _ChunkWriter:
    def __init__(self, job_id: str, model: str) -> None:
        self._id = f"chatcmpl-{job_id}"
        self._model = model
        self._created = int(time.time())
        self._content = sse.TextFrames(
            lambda text: ChatCompletionChunk(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[ChunkChoice(delta=Delta(content=text))],
            ).model_dump_json()
        )

    def content(self, text: str) -> bytes:
        """A chunk carrying `text`: the hot path, once per event of every stream."""
        return self._content.frame(text)

    def delta(self, delta: Delta, finish_reason: str | None = None) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason)
        return self._encode(
            ChatCompletionChunk(
                id=self._id, created=self._created, model=self._model, choices=[choice]
            )
        )

    def usage(self, usage: Usage) -> bytes:
        return self._encode(
            ChatCompletionChunk(
                id=self._id, created=self._created, model=self._model, choices=[], usage=usage
            )
        )

    @staticmethod
    def _encode(chunk: ChatCompletionChunk) -> bytes:
        return sse.encode(chunk.model_dump_json(exclude_none=False))
