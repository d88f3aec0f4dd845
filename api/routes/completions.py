"""`POST /v1/completions`: OpenAI's text completions (a raw prompt, no chat template).

A list `prompt` answers one choice per string, as OpenAI does: each string is its own job
(admitted, queued and batched like any other), and the response (or the stream, with the
choices' chunks interleaved as they come) carries them by `index`, usage summed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import SUBMIT_ERRORS
from tokenrelay.api.jobs.control import cancel_on_leave, cancel_quietly, submit
from tokenrelay.api.jobs.model_routing import check_model
from tokenrelay.api.openai.schema import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionUsage,
)
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.first_output import first_output
from tokenrelay.api.streaming.relay import OpenAIStreamRenderer, collect, merge, relay
from tokenrelay.shared.events import Done, TokenLogprob, Usage

router = APIRouter(prefix="/v1", tags=["completions"], responses=SUBMIT_ERRORS)


@router.post("/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, state: StateDep, caller: CallerDep, http: Request
) -> Completion | StreamingResponse:
    await check_model(state, body.model)
    job_ids: list[str] = []
    try:
        for generation in body.to_generations(state.settings):
            job_ids.append(await submit(state, caller, generation, body.priority, read_here=True))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        response_id = f"cmpl-{job_ids[0]}"
        renders = [
            _CompletionSSE(response_id, body.model, include_usage, index, alone=len(job_ids) == 1)
            for index in range(len(job_ids))
        ]
        if body.stream:
            leaves = [cancel_on_leave(state, job_id) for job_id in job_ids]
            streams = [
                await first_output(state, job_id, http.receive, leave)
                for job_id, leave in zip(job_ids, leaves, strict=True)
            ]
            relays = [
                relay(s, r, on_leave=leave)
                for s, r, leave in zip(streams, renders, leaves, strict=True)
            ]
            return sse.response(_stream(relays, renders, include_usage))
        results = await asyncio.gather(*(collect(state, job_id) for job_id in job_ids))
    except BaseException:
        for job_id in job_ids:
            state.spawn(cancel_quietly(state, job_id))
        raise
    choices = [
        CompletionChoice(
            index=i,
            text=result.text,
            finish_reason=result.done.finish_reason,
            logprobs=None
            if body.logprobs is None
            else CompletionLogprobs.of(result.logprobs or []),
        )
        for i, result in enumerate(results)
    ]
    return renders[0].completion(choices, _total([result.done.usage for result in results]))


async def _stream(
    relays: list[AsyncIterator[bytes]], renders: list[_CompletionSSE], include_usage: bool
) -> AsyncIterator[bytes]:
    async for frame in merge(relays) if len(relays) > 1 else relays[0]:
        yield frame
    if len(relays) == 1:
        return  # the one relay ended the stream itself
    if include_usage:
        usage = _total([r.usage for r in renders if r.usage is not None])
        yield sse.encode(renders[0].completion([], usage).model_dump_json())
    yield renders[0].end()


def _total(usages: list[Usage]) -> Usage:
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cached_tokens=sum(u.cached_tokens for u in usages),
    )


class _CompletionSSE(OpenAIStreamRenderer):
    """OpenAI's text completion chunks of choice `index`, its finish chunk; when it is the
    response's only choice (`alone`) also the usage chunk (if asked) and `[DONE]`, which a
    stream of several choices sends once, after all. Also builds the non-streamed
    `Completion`."""

    def __init__(
        self, response_id: str, model: str, include_usage: bool, index: int, *, alone: bool
    ) -> None:
        super().__init__(response_id, model, include_usage)
        self._index = index
        self._alone = alone
        self.usage: Usage | None = None
        self._offset = 0
        self._text = sse.TextFrames(
            lambda text: self.completion([self._choice(text, None)]).model_dump_json()
        )

    def completion(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=choices,
            usage=None if usage is None else CompletionUsage.of(usage),
        )

    def _choice(self, text: str, finish_reason: str | None) -> CompletionChoice:
        return CompletionChoice(index=self._index, text=text, finish_reason=finish_reason)

    def text(self, text: str) -> bytes:
        return self._text.frame(text)

    def text_with_logprobs(self, text: str, logprobs: list[TokenLogprob]) -> bytes:
        choice = self._choice(text, None)
        choice.logprobs = CompletionLogprobs.of(logprobs, self._offset)
        self._offset += sum(len(entry.token) for entry in logprobs)
        return sse.encode(self.completion([choice]).model_dump_json())

    def done(self, event: Done) -> bytes:
        self.usage = event.usage
        out = sse.encode(self.completion([self._choice("", event.finish_reason)]).model_dump_json())
        if self._alone and self._include_usage:
            out += sse.encode(self.completion([], event.usage).model_dump_json())
        return out

    def end(self) -> bytes:
        return super().end() if self._alone else b""
