"""`POST /v1/chat/completions`: OpenAI-compatible, streaming (SSE) or not."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from tokenrelay.api import sse
from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import SUBMIT_ERRORS
from tokenrelay.api.job_control import submit
from tokenrelay.api.model_routing import check_model
from tokenrelay.api.openai_schema import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
)
from tokenrelay.api.relay import OpenAIStreamRenderer, collect, relay
from tokenrelay.api.state import AppState
from tokenrelay.api.stream_start import first_output
from tokenrelay.shared.events import Done, TokenLogprob, Usage

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
        render = _ChatSSE(job_id, body.model, include_usage)
        return sse.response(relay(state, job_id, events, render))
    return await _complete(state, job_id, body.model, bool(body.logprobs))


async def _complete(state: AppState, job_id: str, model: str, logprobs: bool) -> ChatCompletion:
    result = await collect(state, job_id)
    choice = Choice(
        message=AssistantMessage(content=result.text),
        finish_reason=result.done.finish_reason,
        logprobs=ChoiceLogprobs(content=result.logprobs or []) if logprobs else None,
    )
    return ChatCompletion(
        id=f"chatcmpl-{job_id}",
        created=int(time.time()),
        model=model,
        choices=[choice],
        usage=result.done.usage,
    )


class _ChatSSE(OpenAIStreamRenderer):
    """OpenAI's chat completion chunks: a role chunk, content chunks, a finish chunk (and a
    usage chunk if asked), then `[DONE]`."""

    def __init__(self, job_id: str, model: str, include_usage: bool) -> None:
        super().__init__(f"chatcmpl-{job_id}", model, include_usage)
        self._content = sse.TextFrames(
            lambda text: ChatCompletionChunk(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[ChunkChoice(delta=Delta(content=text))],
            ).model_dump_json()
        )

    def start(self) -> bytes:
        return self._delta(Delta(role="assistant", content=""))

    def text(self, text: str) -> bytes:
        """A chunk carrying `text`: the hot path, once per event of every stream."""
        return self._content.frame(text)

    def text_with_logprobs(self, text: str, logprobs: list[TokenLogprob]) -> bytes:
        choice = ChunkChoice(delta=Delta(content=text), logprobs=ChoiceLogprobs(content=logprobs))
        return self._encode(
            ChatCompletionChunk(
                id=self._id, created=self._created, model=self._model, choices=[choice]
            )
        )

    def done(self, event: Done) -> bytes:
        out = self._delta(Delta(), finish_reason=event.finish_reason)
        if self._include_usage:
            out += self._usage(event.usage)
        return out

    def _delta(self, delta: Delta, finish_reason: str | None = None) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason)
        return self._encode(
            ChatCompletionChunk(
                id=self._id, created=self._created, model=self._model, choices=[choice]
            )
        )

    def _usage(self, usage: Usage) -> bytes:
        return self._encode(
            ChatCompletionChunk(
                id=self._id, created=self._created, model=self._model, choices=[], usage=usage
            )
        )

    @staticmethod
    def _encode(chunk: ChatCompletionChunk) -> bytes:
        return sse.encode(chunk.model_dump_json(exclude_none=False))
