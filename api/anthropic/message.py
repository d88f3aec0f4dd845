"""Anthropic's reply bodies: the `Message`, its content blocks and usage, the token count.

`usage` follows Anthropic's reading: `input_tokens` are the prompt tokens the worker
prefilled, `cache_read_input_tokens` those its prefix cache held instead, so their sum is
the prompt's size, which `count_tokens` answers before the request runs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from tokenrelay.shared.events import Done, Usage

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0

    @classmethod
    def of(cls, usage: Usage) -> MessageUsage:
        cached = usage.cached_tokens
        return cls(
            input_tokens=usage.prompt_tokens - cached,
            output_tokens=usage.completion_tokens,
            cache_read_input_tokens=cached,
        )


class Message(BaseModel):
    """The reply of `POST /v1/messages` (and, with no content yet, a stream's
    `message_start`)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


class TokenCount(BaseModel):
    """The reply of `POST /v1/messages/count_tokens`."""

    input_tokens: int = Field(
        description="The prompt's tokens, chat template included: the reply's "
        "`input_tokens` + `cache_read_input_tokens`."
    )


def stop_reason(done: Done, called: bool) -> StopReason:
    """Why the reply ended, in Anthropic's words (`called`: it holds tool calls)."""
    if done.finish_reason == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    return "end_turn" if done.stop_sequence is None else "stop_sequence"


def stop_sequence(done: Done, called: bool) -> str | None:
    return done.stop_sequence if stop_reason(done, called) == "stop_sequence" else None
