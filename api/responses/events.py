"""A job's events as the Responses API's stream, and the response object they build.

`ResponseEvents` turns a job's events, in order, into OpenAI's numbered stream events:
`response.created`, `response.in_progress` (when a worker starts the job), then for each
output item `response.output_item.added`, its content (`response.content_part.added`,
`response.output_text.delta` ... `.done`, `response.content_part.done`; or
`response.function_call_arguments.delta` ... `.done`) and `response.output_item.done`, and
last `response.completed`, `response.incomplete` (the reply hit `max_output_tokens`) or, for
a job that failed or was cancelled, an `error` event and `response.failed`.

The numbering depends on the job's events alone: item ids are the job id and the item's
index, a call's `call_id` too, never a random id. So a stream rendered again from the job's
event log, in any API process, numbers every event as the first rendering did, and a
resume (`starting_after=N`) sends exactly the events numbered after N (`skip_through`); and
a poll, a stored response and a stream all show the same ids. An event the log does not
hold (Redis lost mid-stream) reuses the last number, so it shifts none.

HOT PATH: `text` runs once per token event of every Responses stream; a delta's bytes are
the item's framing around `json.dumps(text)` and the sequence number, no model serialised
(docs/architecture.md, "The per-token path").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from tokenrelay.api.openai.tool_calls import Arguments, CallStart, Content, Piece, ToolCallParser
from tokenrelay.api.responses.objects import (
    FunctionCall,
    IncompleteDetails,
    ItemStatus,
    OutputItem,
    OutputMessage,
    OutputTextPart,
    ResponseError,
    ResponseObject,
    ResponseShell,
    ResponseStatus,
    ResponseUsage,
)
from tokenrelay.shared.errors import JobCancelled
from tokenrelay.shared.events import Done, Event, Started, TokenChunk, TokenLogprob

_TEXT_DELTA = "response.output_text.delta"
_ARGUMENTS_DELTA = "response.function_call_arguments.delta"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: A text as a JSON string, non-ASCII kept: what `json.dumps(text, ensure_ascii=False)` gives,
#: without the encoder `json.dumps` builds per call when given options (most of its cost).
_json_string = encode_basestring


def frame(kind: str, data: dict[str, Any]) -> bytes:
    """One SSE event: OpenAI names each with its type, as `event:` and in the data."""
    return f"event: {kind}\ndata: {_dumps(data)}\n\n".encode()


@dataclass
class _Message:
    index: int
    id: str
    #: The delta event's bytes up to its `delta` value.
    head: bytes
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def item(self, status: ItemStatus) -> OutputMessage:
        part = OutputTextPart(text="".join(self.parts), logprobs=self.logprobs)
        return OutputMessage(id=self.id, status=status, content=[part])


@dataclass
class _Call:
    index: int
    id: str
    call_id: str
    name: str
    namespace: str | None
    head: bytes
    arguments: list[str] = field(default_factory=list)

    def item(self, status: ItemStatus) -> FunctionCall:
        return FunctionCall(
            id=self.id,
            status=status,
            call_id=self.call_id,
            name=self.name,
            arguments="".join(self.arguments),
            namespace=self.namespace,
        )


class ResponseEvents:
    """The stream of one response, fed its job's events in order. `emit=False` builds the
    response object alone (a poll, a non-streaming request); `skip_through` numbers and
    drops the events a resumed client already has."""

    def __init__(self, shell: ResponseShell, *, skip_through: int = -1, emit: bool = True) -> None:
        self._shell = shell
        plan = shell.plan
        self._parser = None
        if plan.parse_calls:
            self._parser = ToolCallParser(plan.parallel, name=plan.parser, functions=plan.functions)
        self._skip = skip_through if emit else 2**63
        self._seq = 0
        self._started = False
        self._items: list[OutputItem] = []
        self._open: _Message | _Call | None = None
        self._pending_logprobs: list[TokenLogprob] = []
        #: The response as it ended; None until then.
        self.final: ResponseObject | None = None

    @property
    def last_sequence_number(self) -> int:
        return self._seq - 1

    def feed(self, event: Event, finished_at: float | None = None) -> bytes:
        """The stream events of the job's next event (`finished_at`: when the job ended, for
        a rendering after the fact)."""
        if isinstance(event, TokenChunk):
            return self.text(event.text, event.logprobs)
        if isinstance(event, Started):
            return self.started()
        if isinstance(event, Done):
            return self.done(event, finished_at)
        return self.failed(event.error_type, event.message)

    def created(self) -> bytes:
        status: ResponseStatus = "queued" if self._shell.echo.background else "in_progress"
        return self._event("response.created", lambda: {"response": self._dump(status)})

    def started(self) -> bytes:
        """The job's first start (a continuation's start adds nothing)."""
        if self._started:
            return b""
        self._started = True
        return self._event("response.in_progress", lambda: {"response": self._dump("in_progress")})

    def text(self, text: str, logprobs: list[TokenLogprob] | None = None) -> bytes:
        if logprobs:
            self._pending_logprobs += logprobs
        if self._parser is None:
            return self._content(text) if text else b""
        return self._pieces(self._parser.feed(text))

    def done(self, event: Done, finished_at: float | None = None) -> bytes:
        """The end of the reply: its last items, then `response.completed` (or
        `.incomplete` when it ran out of `max_output_tokens`)."""
        out = self._pieces(self._parser.finish()) if self._parser is not None else b""
        cut = event.finish_reason == "length"
        out += self._close("incomplete" if cut else "completed")
        status: ResponseStatus = "incomplete" if cut else "completed"
        self.final = self._shell.object(
            status,
            list(self._items),
            usage=ResponseUsage.of(event.usage),
            incomplete=IncompleteDetails(reason="max_output_tokens") if cut else None,
            completed_at=finished_at or time.time(),
        )
        final = self.final
        kind = "response.incomplete" if cut else "response.completed"
        return out + self._event(kind, lambda: {"response": final.model_dump(mode="json")})

    def failed(self, error_type: str, message: str) -> bytes:
        """The job ended with an error: OpenAI's `error` event, then `response.failed` (its
        status `cancelled` for a cancelled job)."""
        out = self._close("incomplete")
        status: ResponseStatus = "cancelled" if error_type == JobCancelled.error_type else "failed"
        self.final = self._shell.object(
            status, list(self._items), error=ResponseError(code=error_type, message=message)
        )
        final = self.final
        error = {"code": error_type, "message": message, "param": None}
        out += self._event("error", lambda: error)
        return out + self._event(
            "response.failed", lambda: {"response": final.model_dump(mode="json")}
        )

    def interrupted(self, error_type: str, message: str) -> bytes:
        """An `error` event for what the job's log does not hold (Redis lost mid-stream): it
        takes the last number again, so a resume from it misses nothing."""
        data = {"type": "error", "sequence_number": max(self.last_sequence_number, 0)}
        return frame("error", data | {"code": error_type, "message": message, "param": None})

    def snapshot(self) -> ResponseObject:
        """The response so far: ended, or `queued` / `in_progress` with its open item."""
        if self.final is not None:
            return self.final
        output = list(self._items)
        if self._open is not None:
            output.append(self._open.item("in_progress"))
        return self._shell.object("in_progress" if self._started else "queued", output)

    def _pieces(self, pieces: list[Piece]) -> bytes:
        out = b""
        for piece in pieces:
            match piece:
                case Content(text=text):
                    out += self._content(text)
                case CallStart(name=name):
                    out += self._close("completed") + self._open_call(name)
                case Arguments(text=text):
                    out += self._arguments(text)
        return out

    def _content(self, text: str) -> bytes:
        """A text delta of the open message (opened first if need be): the hot path."""
        message = self._open
        out = b""
        if not isinstance(message, _Message):
            out = self._close("completed") + self._open_message()
            message = self._open
            assert isinstance(message, _Message)
        message.parts.append(text)
        logprobs = self._pending_logprobs
        if logprobs:
            message.logprobs += logprobs
            self._pending_logprobs = []
        seq = self._seq
        self._seq += 1
        if seq <= self._skip:
            return out
        entries = _dumps([entry.model_dump() for entry in logprobs]) if logprobs else "[]"
        tail = f',"logprobs":{entries},"sequence_number":{seq}}}\n\n'
        return out + message.head + _json_string(text).encode() + tail.encode()

    def _arguments(self, text: str) -> bytes:
        call = self._open
        assert isinstance(call, _Call)
        call.arguments.append(text)
        seq = self._seq
        self._seq += 1
        if seq <= self._skip:
            return b""
        return call.head + _json_string(text).encode() + f',"sequence_number":{seq}}}\n\n'.encode()

    def _open_message(self) -> bytes:
        index = len(self._items)
        item_id = f"msg_{self._shell.job_id}_{index}"
        head = _delta_head(_TEXT_DELTA, item_id, index, ',"content_index":0')
        message = self._open = _Message(index, item_id, head)
        added = message.item("in_progress").model_copy(update={"content": []})
        part = OutputTextPart(text="")
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return self._added(index, added) + self._event(
            "response.content_part.added", lambda: where | {"part": part.model_dump(mode="json")}
        )

    def _open_call(self, name: str) -> bytes:
        index = len(self._items)
        job = self._shell.job_id
        item_id, call_id = f"fc_{job}_{index}", f"call_{job}_{index}"
        namespace = self._shell.plan.namespaces.get(name)
        head = _delta_head(_ARGUMENTS_DELTA, item_id, index, "")
        call = self._open = _Call(index, item_id, call_id, name, namespace, head)
        return self._added(index, call.item("in_progress"))

    def _close(self, status: ItemStatus) -> bytes:
        """Close the open item, if any: its `.done` events."""
        item = self._open
        if item is None:
            return b""
        self._open = None
        done = item.item(status)
        self._items.append(done)
        where = {"item_id": item.id, "output_index": item.index}
        out = b""
        if isinstance(done, OutputMessage):
            part = done.content[0]
            text = where | {"content_index": 0, "text": part.text}
            out += self._event(
                "response.output_text.done",
                lambda: text | {"logprobs": [entry.model_dump() for entry in part.logprobs]},
            ) + self._event(
                "response.content_part.done",
                lambda: where | {"content_index": 0, "part": part.model_dump(mode="json")},
            )
        else:
            arguments = {"name": done.name, "arguments": done.arguments}
            out += self._event("response.function_call_arguments.done", lambda: where | arguments)
        return out + self._event(
            "response.output_item.done",
            lambda: {"output_index": item.index, "item": done.model_dump(mode="json")},
        )

    def _added(self, index: int, item: OutputItem) -> bytes:
        return self._event(
            "response.output_item.added",
            lambda: {"output_index": index, "item": item.model_dump(mode="json")},
        )

    def _event(self, kind: str, data: Callable[[], dict[str, Any]]) -> bytes:
        """The next numbered event; its data is built only when it is sent."""
        seq = self._seq
        self._seq += 1
        if seq <= self._skip:
            return b""
        return frame(kind, {"type": kind, "sequence_number": seq} | data())

    def _dump(self, status: ResponseStatus) -> dict[str, Any]:
        return self._shell.object(status, []).model_dump(mode="json")


def _delta_head(kind: str, item_id: str, index: int, extra: str) -> bytes:
    data = f'{{"type":"{kind}","item_id":"{item_id}","output_index":{index}{extra},"delta":'
    return f"event: {kind}\ndata: {data}".encode()
