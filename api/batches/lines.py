"""One batch line: checked as its endpoint's request would be, turned into the generation a
job runs, and its result written in OpenAI's output line format."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import ValidationError

from tokenrelay.api.openai.schema import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    CompletionUsage,
)
from tokenrelay.api.responses.batch_lines import line_generation, line_response
from tokenrelay.shared.errors import InvalidRequest, TokenrelayError, from_type
from tokenrelay.shared.events import Usage
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.jobs import JobRecord
from tokenrelay.shared.settings import Settings

#: Request fields a batch line may not set: a batch returns whole responses, at its own
#: priority, and its results keep no log probabilities.
REFUSED_IN_BATCH = ("stream", "stream_options", "priority", "logprobs", "top_logprobs")


class LineError(Exception):
    """A line that fails validation: OpenAI's `errors.data` item, without the line number."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def parse_line(raw: bytes, endpoint: str) -> tuple[str, dict[str, Any]]:
    """The line's `custom_id` and `body`; raises `LineError` for anything OpenAI refuses."""
    try:
        line = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LineError("invalid_json_line", f"the line is not valid JSON: {exc}") from exc
    if not isinstance(line, dict):
        raise LineError("invalid_json_line", "the line must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(
            "missing_required_parameter", "`custom_id` must be a non-empty string", "custom_id"
        )
    if line.get("method") != "POST":
        raise LineError("invalid_method", "`method` must be POST", "method")
    if line.get("url") != endpoint:
        raise LineError(
            "mismatched_endpoint", f"`url` must be the batch's endpoint {endpoint}", "url"
        )
    body = line.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "`body` must be a JSON object", "body")
    unknown = set(line) - {"custom_id", "method", "url", "body"}
    if unknown:
        raise LineError("invalid_request", f"unknown field `{sorted(unknown)[0]}`")
    return custom_id, body


def generation(body: dict[str, Any], endpoint: str, settings: Settings) -> GenerationRequest:
    """The generation a line's job runs; raises `LineError` for a body its endpoint refuses."""
    for name in REFUSED_IN_BATCH:
        if body.get(name) not in (None, False):
            raise LineError(
                "invalid_request", f"`body.{name}` is not supported in a batch", f"body.{name}"
            )
    try:
        if endpoint == "/v1/chat/completions":
            return ChatCompletionRequest.model_validate(body).to_generation(settings)
        if endpoint == "/v1/responses":
            return line_generation(body, settings)
        generations = CompletionRequest.model_validate(body).to_generations(settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise LineError(
            "invalid_request", f"`body.{where}`: {first.get('msg')}", f"body.{where}"
        ) from exc
    except InvalidRequest as exc:
        raise LineError(
            "invalid_request", exc.message, f"body.{exc.param}" if exc.param else "body"
        ) from exc
    if len(generations) != 1:
        raise LineError(
            "invalid_request", "`body.prompt` must be one string in a batch", "body.prompt"
        )
    return generations[0]


def output_line(custom_id: str, endpoint: str, model: str, record: JobRecord) -> str:
    """The output file's line for a job that succeeded."""
    created = int(record.finished_at or time.time())
    if endpoint == "/v1/responses":
        response = {
            "status_code": 200,
            "request_id": record.id,
            "body": line_response(record, model),
        }
        return _line(record.id, custom_id, response, None)
    body: ChatCompletion | Completion
    if endpoint == "/v1/chat/completions":
        choice = Choice(
            message=AssistantMessage(content=record.text), finish_reason=record.finish_reason
        )
        body = ChatCompletion(
            id=f"chatcmpl-{record.id}",
            created=created,
            model=model,
            choices=[choice],
            usage=CompletionUsage.of(
                record.usage or Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
            ),
        )
    else:
        text_choice = CompletionChoice(
            index=0, text=record.text, finish_reason=record.finish_reason
        )
        body = Completion(
            id=f"cmpl-{record.id}",
            created=created,
            model=model,
            choices=[text_choice],
            usage=None if record.usage is None else CompletionUsage.of(record.usage),
        )
    response = {"status_code": 200, "request_id": record.id, "body": body.model_dump(mode="json")}
    return _line(record.id, custom_id, response, None)


def failed_line(custom_id: str, record: JobRecord) -> str:
    """The error file's line for a job that ended with an error: the HTTP error its
    endpoint would have answered."""
    error: TokenrelayError = from_type(
        record.error.type if record.error else "internal_error",
        record.error.message if record.error else "the job ended without a result",
    )
    response = {"status_code": error.status_code, "request_id": record.id, "body": error.body()}
    return _line(record.id, custom_id, response, None)


def unrun_line(line_id: str, custom_id: str, code: str, message: str) -> str:
    """The error file's line for a request that never ran to a response."""
    return _line(line_id, custom_id, None, {"code": code, "message": message})


def _line(
    request_id: str, custom_id: str, response: dict[str, Any] | None, error: dict[str, str] | None
) -> str:
    return json.dumps(
        {
            "id": f"batch_req_{request_id}",
            "custom_id": custom_id,
            "response": response,
            "error": error,
        },
        separators=(",", ":"),
    )
