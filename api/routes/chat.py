"""`POST /v1/chat/completions`: OpenAI-compatible, streaming (SSE) or not; with `tools`, the
reply's calls are parsed into `tool_calls` by the model's parser (`api.openai.tool_calls`,
`api.jobs.tool_parser`), whole or as deltas."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import SUBMIT_ERRORS
from tokenrelay.api.jobs.control import cancel_on_leave, submit
from tokenrelay.api.jobs.model_routing import check_model
from tokenrelay.api.jobs.tool_parser import tool_call_parser
from tokenrelay.api.openai.schema import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionUsage,
    Delta,
)
from tokenrelay.api.openai.tool_calls import (
    Arguments,
    CallStart,
    Content,
    Piece,
    ToolCallParser,
    parse_reply,
)
from tokenrelay.api.openai.tools import FunctionDelta, OutputToolCall, ToolCallDelta
from tokenrelay.api.state import AppState
from tokenrelay.api.streaming import sse
from tokenrelay.api.streaming.first_output import first_output
from tokenrelay.api.streaming.relay import OpenAIStreamRenderer, collect, relay
from tokenrelay.shared.events import Done, TokenLogprob, Usage

router = APIRouter(prefix="/v1", tags=["chat"], responses=SUBMIT_ERRORS)


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, state: StateDep, caller: CallerDep, http: Request
) -> ChatCompletion | StreamingResponse:
    await check_model(state, body.model)
    request = body.to_generation(state.settings)
    tools = body.tool_selection()
    parser = await tool_call_parser(state, body.model, tools)
    job_id = await submit(state, caller, request, body.priority, read_here=True)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        leave = cancel_on_leave(state, job_id)
        events = await first_output(state, job_id, http.receive, leave)
        render = _ChatSSE(job_id, body.model, include_usage, parser)
        return sse.response(relay(events, render, on_leave=leave))
    return await _complete(state, job_id, body.model, bool(body.logprobs), parser)


async def _complete(
    state: AppState, job_id: str, model: str, logprobs: bool, parser: ToolCallParser | None
) -> ChatCompletion:
    result = await collect(state, job_id)
    content: str | None = result.text
    finish_reason: str = result.done.finish_reason
    calls: list[OutputToolCall] | None = None
    if parser is not None:
        content, found = parse_reply(result.text, parser)
        if found:
            calls = [OutputToolCall.of(call) for call in found]
            finish_reason = _with_calls(finish_reason)
    choice = Choice(
        message=AssistantMessage(content=content, tool_calls=calls),
        finish_reason=finish_reason,
        logprobs=ChoiceLogprobs(content=result.logprobs or []) if logprobs else None,
    )
    return ChatCompletion(
        id=f"chatcmpl-{job_id}",
        created=int(time.time()),
        model=model,
        choices=[choice],
        usage=CompletionUsage.of(result.done.usage),
    )


def _with_calls(finish_reason: str) -> str:
    """OpenAI's `tool_calls` for a reply that ended by itself with calls in it."""
    return "tool_calls" if finish_reason == "stop" else finish_reason


class _ChatSSE(OpenAIStreamRenderer):
    """OpenAI's chat completion chunks: a role chunk, content chunks (and tool call deltas,
    with a `parser`), a finish chunk (and a usage chunk if asked), then `[DONE]`."""

    def __init__(
        self, job_id: str, model: str, include_usage: bool, parser: ToolCallParser | None = None
    ) -> None:
        super().__init__(f"chatcmpl-{job_id}", model, include_usage)
        self._parser = parser
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
        if self._parser is not None:
            return self._pieces(self._parser.feed(text))
        return self._content.frame(text)

    def text_with_logprobs(self, text: str, logprobs: list[TokenLogprob]) -> bytes:
        if self._parser is not None:  # the text's first chunk carries them
            deltas = [_delta_of(piece) for piece in self._parser.feed(text)] or [Delta()]
            head = self._delta(deltas[0], logprobs=ChoiceLogprobs(content=logprobs))
            return head + b"".join(self._delta(delta) for delta in deltas[1:])
        return self._delta(Delta(content=text), logprobs=ChoiceLogprobs(content=logprobs))

    def done(self, event: Done) -> bytes:
        out, finish_reason = b"", str(event.finish_reason)
        if self._parser is not None:
            out = self._pieces(self._parser.finish())
            if self._parser.calls:
                finish_reason = _with_calls(finish_reason)
        out += self._delta(Delta(), finish_reason=finish_reason)
        if self._include_usage:
            out += self._usage(event.usage)
        return out

    def _pieces(self, pieces: list[Piece]) -> bytes:
        return b"".join(self._delta(_delta_of(piece)) for piece in pieces)

    def _delta(
        self,
        delta: Delta,
        finish_reason: str | None = None,
        logprobs: ChoiceLogprobs | None = None,
    ) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason, logprobs=logprobs)
        return self._encode(
            ChatCompletionChunk(
                id=self._id, created=self._created, model=self._model, choices=[choice]
            )
        )

    def _usage(self, usage: Usage) -> bytes:
        return self._encode(
            ChatCompletionChunk(
                id=self._id,
                created=self._created,
                model=self._model,
                choices=[],
                usage=CompletionUsage.of(usage),
            )
        )

    @staticmethod
    def _encode(chunk: ChatCompletionChunk) -> bytes:
        return sse.encode(chunk.model_dump_json(exclude_none=False))


def _delta_of(piece: Piece) -> Delta:
    match piece:
        case Content(text=text):
            return Delta(content=text)
        case CallStart(index=index, id=call_id, name=name):
            function = FunctionDelta(name=name, arguments="")
            return Delta(
                tool_calls=[
                    ToolCallDelta(index=index, id=call_id, type="function", function=function)
                ]
            )
        case Arguments(index=index, text=text):
            return Delta(
                tool_calls=[ToolCallDelta(index=index, function=FunctionDelta(arguments=text))]
            )
