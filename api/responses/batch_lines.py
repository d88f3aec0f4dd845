"""A batch line whose endpoint is `/v1/responses` (`api.batches.lines`): its body checked and
run as a response's, its result a response object. A line stands alone and is not stored
(its result is in the batch's output file): `previous_response_id`, `store`, `background`
and tools (a line's result is text) are refused."""

from __future__ import annotations

from typing import Any

from tokenrelay.api.responses.conversation import Plan, build
from tokenrelay.api.responses.events import ResponseEvents
from tokenrelay.api.responses.objects import Echo, ResponseShell
from tokenrelay.api.responses.schema import ResponseRequest
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.events import Done, Usage
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.jobs import JobRecord
from tokenrelay.shared.settings import Settings

REFUSED_IN_LINE = {
    "previous_response_id": "a batch line stands alone",
    "store": "a batch line's response is in the output file, not stored",
    "background": "a batch runs in the background already",
    "tools": "a batch line's result is text",
    "tool_choice": "a batch line's result is text",
}


def line_generation(body: dict[str, Any], settings: Settings) -> GenerationRequest:
    """The generation of a line's body; raises `ValidationError` or `InvalidRequest`."""
    request = ResponseRequest.model_validate(body)
    for name, reason in REFUSED_IN_LINE.items():
        if getattr(request, name) not in (None, False):
            raise InvalidRequest(f"`{name}` is not supported in a batch: {reason}", param=name)
    generation, _ = build(request, [], settings)
    return generation


def line_response(record: JobRecord, model: str) -> dict[str, Any]:
    """The response object of a line's job that succeeded."""
    shell = ResponseShell(
        id=f"resp_{record.id}",
        job_id=record.id,
        created_at=record.created_at,
        echo=Echo(model=model, store=False, background=True),
        plan=Plan(),
    )
    events = ResponseEvents(shell, emit=False)
    events.started()
    events.text(record.text)
    usage = record.usage or Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
    cut = record.finish_reason == "length"
    events.done(Done(finish_reason="length" if cut else "stop", usage=usage), record.finished_at)
    assert events.final is not None
    return events.final.model_dump(mode="json")
