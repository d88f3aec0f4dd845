"""`POST /v1/completions`: OpenAI's text completions (a raw prompt, no chat template)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from tokenrelay.api import sse
from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import SUBMIT_ERRORS
from tokenrelay.api.job_control import submit
from tokenrelay.api.model_routing import check_model
from tokenrelay.api.openai_schema import Completion, CompletionChoice, CompletionRequest
from tokenrelay.api.relay import OpenAIStreamRenderer, collect, relay
from tokenrelay.api.stream_start import first_output
from tokenrelay.shared.events import Done

router = APIRouter(prefix="/v1", tags=["completions"], responses=SUBMIT_ERRORS)


@router.post("/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, state: StateDep, caller: CallerDep, http: Request
) -> Completion | StreamingResponse:
    await check_model(state, body.model)
    job_id = await submit(state, caller, body.to_generation(state.settings), body.priority)
    render = _CompletionSSE(
        job_id, body.model, bool(body.stream_options and body.stream_options.include_usage)
    )
    if body.stream:
        events = await first_output(state, job_id, http.receive)
        return sse.response(relay(state, job_id, events, render))
    text, done = await collect(state, job_id)
    return render.completion(text, done.finish_reason, done)


class _CompletionSSE(OpenAIStreamRenderer):
    """OpenAI's text completion chunks, a finish chunk (and a usage chunk if asked), then
    `[DONE]`; also builds the non-streamed `Completion`."""

    def __init__(self, job_id: str, model: str, include_usage: bool) -> None:
        super().__init__(f"cmpl-{job_id}", model, include_usage)
        self._text = sse.TextFrames(
            lambda text: self.completion(text, None, None).model_dump_json()
        )

    def completion(self, text: str, finish_reason: str | None, done: Done | None) -> Completion:
        return Completion(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
            usage=done.usage if done is not None else None,
        )

    def text(self, text: str) -> bytes:
        return self._text.frame(text)

    def done(self, event: Done) -> bytes:
        final = self.completion("", event.finish_reason, None)
        out = sse.encode(final.model_dump_json())
        if self._include_usage:
            usage = Completion(
                id=self._id, created=self._created, model=self._model, choices=[], usage=event.usage
            )
            out += sse.encode(usage.model_dump_json())
        return out
