"""Typed events of a job's stream: what a worker publishes and an API node forwards.

Each event carries `seq`, its position in the job's replay log. The worker running a job
numbers that job's events (`worker.delivery`), and EMIT applies only the next one, so a
resend is a no-op; the scripts that end a job from elsewhere (reaper, cancel) take the next
number themselves. Events travel without `seq` (`to_wire`); the script splices it in.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class Usage(BaseModel):
    """A job's token counts; `cached_tokens` of its `prompt_tokens` came from the worker's
    prefix cache instead of being prefilled (0 in events stored before it existed)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)

    seq: int = -1

    def to_wire(self) -> str:
        """JSON without `seq`, starting with `{"type":` (the append script adds `seq`)."""
        return self.model_dump_json(exclude={"seq"})


class Started(_Event):
    type: Literal["started"] = "started"
    worker: str
    prompt_tokens: int
    #: Seconds from admission to this start (Redis `TIME`, as the job hash's `created_at`
    #: and `started_at`): added by START where one Redis holds both planes, absent otherwise.
    queue_wait_s: float | None = None
    #: Which start of the job this is, from 2 on (a continuation: docs/operations/
    #: failure-behaviour.md); added by START, absent on a job's first start.
    attempt: int | None = None

    def to_wire(self) -> str:
        return self.model_dump_json(exclude={"seq"}, exclude_none=True)


class TopLogprob(BaseModel):
    """One candidate token: its text, its UTF-8 bytes (a token can hold part of a
    character) and its log probability."""

    token: str
    bytes: list[int]
    logprob: float


class TokenLogprob(TopLogprob):
    """A generated token's log probability, and the likeliest candidates at its step."""

    top_logprobs: list[TopLogprob]


class TokenChunk(_Event):
    """Text generated since the previous chunk; `tokens` is how many tokens it holds,
    `token_ids` their ids (what a continuation on another worker prefills after the prompt,
    never the text tokenized again), and `logprobs` (only when the job asked for them) one
    entry per token."""

    type: Literal["token"] = "token"
    text: str
    tokens: int
    token_ids: list[int] | None = None
    logprobs: list[TokenLogprob] | None = None

    def to_wire(self) -> str:
        return self.model_dump_json(exclude={"seq"}, exclude_none=True)


class Done(_Event):
    """The end of a job's text; `stop_sequence` is the request's stop string that ended it
    (absent when it ended otherwise), which Anthropic's Messages API reports."""

    type: Literal["done"] = "done"
    finish_reason: Literal["stop", "length"]
    usage: Usage
    stop_sequence: str | None = None

    def to_wire(self) -> str:
        return self.model_dump_json(exclude={"seq"}, exclude_none=True)


class Error(_Event):
    """Terminal failure: `error_type` is one of `shared.errors`' types."""

    type: Literal["error"] = "error"
    error_type: str
    message: str


Event = Annotated[Started | TokenChunk | Done | Error, Field(discriminator="type")]
TERMINAL_TYPES = frozenset({"done", "error"})

_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(raw: str | bytes) -> Event:
    """Parse one event as stored in the replay log or published on the channel."""
    return _adapter.validate_json(raw)


def is_terminal(event: Event) -> bool:
    return event.type in TERMINAL_TYPES
