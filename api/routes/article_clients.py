"""The request and response shapes of the two articles tokenrelay grew from, so their
clients work unchanged (docs/http-api/article-routes.md).

`POST /` — the first article: `{"prompt"}` in, `{"response", "status", "time"}` out. It
streams when the body says `"stream": true`, the client accepts `text/event-stream`, or
the body is sent as `application/octet-stream` (what that article's streaming client
does): SSE `message` events in sse-starlette's framing, each `data` a JSON string of the
new text, so newlines survive (the article had to `repr()` its tokens to keep them).
Errors, busy included, keep the same body shape with the real HTTP status (503, not 200).

`POST /chat` — the second article (qwen-vllm): `{"query", "history": [[q, a], ...],
"system", "stream", "user_stop_words"}` in, `{"text"}` out; streaming sends the cumulative
text as NUL-delimited JSON objects. Generation ends on the worker as soon as the output
contains a user stop word, which stays in the text, as in the article.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import SUBMIT_ERRORS
from tokenrelay.api.errors import retry_headers
from tokenrelay.api.jobs.control import cancel_on_leave, submit
from tokenrelay.api.openai.schema import ChatCompletionRequest
from tokenrelay.api.state import AppState
from tokenrelay.api.streaming.first_output import first_output
from tokenrelay.api.streaming.relay import GenerationRenderer, collect, relay
from tokenrelay.shared.errors import InvalidRequest, TokenrelayError
from tokenrelay.shared.events import Done

router = APIRouter(tags=["article clients"])

DEFAULT_SYSTEM = "You are a helpful assistant."
_STREAM_CONTENT_TYPE = "application/octet-stream"


class PromptRequest(BaseModel):
    """The first article's request body, as documented (the route reads it by hand: any
    content type is taken as JSON)."""

    prompt: str = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None


class PromptResponse(BaseModel):
    """The first article's response (and error) body."""

    response: str
    status: int
    time: str


class ArticleChatRequest(BaseModel):
    """The second article's request body."""

    model_config = ConfigDict(extra="ignore")

    query: str = Field(min_length=1)
    history: list[tuple[str, str]] = Field(default_factory=list)
    system: str = DEFAULT_SYSTEM
    stream: bool = False
    user_stop_words: list[str] = Field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None


class ArticleChatResponse(BaseModel):
    text: str


@router.post(
    "/",
    response_model=PromptResponse,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": PromptRequest.model_json_schema()}},
        }
    },
    responses={
        status: {"model": PromptResponse, "description": "Error, in the same body shape"}
        for status in (400, 401, 404, 413, 429, 503)
    },
)
async def prompt_completion(
    http: Request, state: StateDep, caller: CallerDep
) -> JSONResponse | StreamingResponse:
    """The first article's endpoint: any content type, JSON body `{"prompt": "..."}`."""
    try:
        body = await _json_object(http)
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequest("`prompt` must be a non-empty string", param="prompt")
        chat = _chat_request(
            state,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=body.get("max_tokens"),
            temperature=body.get("temperature"),
        )
        job_id = await submit(
            state, caller, chat.to_generation(state.settings), chat.priority, read_here=True
        )
        if _wants_stream(http, body):
            leave = cancel_on_leave(state, job_id)
            events = await first_output(state, job_id, http.receive, leave)
            return StreamingResponse(
                relay(events, _PromptSSE(), on_leave=leave), media_type="text/event-stream"
            )
        text = (await collect(state, job_id)).text
    except TokenrelayError as exc:
        return _prompt_body(exc.message, exc.status_code, retry_headers(exc))
    return _prompt_body(text, 200)


@router.post("/chat", response_model=ArticleChatResponse, responses=SUBMIT_ERRORS)
async def article_chat(
    body: ArticleChatRequest, http: Request, state: StateDep, caller: CallerDep
) -> ArticleChatResponse | StreamingResponse:
    """The second article's endpoint (qwen-vllm's `/chat`)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": body.system}]
    for question, answer in body.history:
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    messages.append({"role": "user", "content": body.query})
    chat = _chat_request(
        state,
        messages=messages,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        seed=body.seed,
        stop=body.user_stop_words or None,
        include_stop_str_in_output=True,
    )
    job_id = await submit(
        state, caller, chat.to_generation(state.settings), chat.priority, read_here=True
    )
    if body.stream:
        leave = cancel_on_leave(state, job_id)
        events = await first_output(state, job_id, http.receive, leave)
        return StreamingResponse(relay(events, _CumulativeText(), on_leave=leave))
    text = (await collect(state, job_id)).text
    return ArticleChatResponse(text=text)


def _chat_request(state: AppState, **fields: Any) -> ChatCompletionRequest:
    """The equivalent chat completion request, validated like one."""
    fields = {name: value for name, value in fields.items() if value is not None}
    try:
        chat = ChatCompletionRequest.model_validate({"model": state.settings.model_id, **fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise InvalidRequest(f"`{field}`: {first['msg']}", param=field) from None
    return chat


async def _json_object(http: Request) -> dict[str, Any]:
    try:
        body = json.loads(await http.body())
    except ClientDisconnect:  # gone, or cut off at the body deadline: nobody reads the answer
        raise InvalidRequest("the request body did not arrive") from None
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("the request body is not valid JSON") from None
    except RecursionError:
        raise InvalidRequest("the request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _wants_stream(http: Request, body: dict[str, Any]) -> bool:
    return (
        body.get("stream") is True
        or "text/event-stream" in http.headers.get("accept", "")
        or http.headers.get("content-type", "").startswith(_STREAM_CONTENT_TYPE)
    )


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _prompt_body(response: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    body = PromptResponse(response=response, status=status, time=_now())
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


class _PromptSSE(GenerationRenderer):
    """sse-starlette's framing, which the first article's client splits on."""

    def text(self, text: str) -> bytes:
        return self._event("message", json.dumps(text, ensure_ascii=False))

    def done(self, event: Done) -> None:
        return None

    def error(self, exc: TokenrelayError) -> bytes:
        return self._event("error", json.dumps(exc.body()["error"], ensure_ascii=False))

    def ping(self) -> None:
        return None  # the article's client splits every chunk on "\r\ndata:"

    def end(self) -> None:
        return None

    @staticmethod
    def _event(name: str, data: str) -> bytes:
        return f"event: {name}\r\ndata: {data}\r\nretry: 15000\r\n\r\n".encode()


class _CumulativeText(GenerationRenderer):
    """The second article's stream: the whole text so far, as JSON, then a NUL byte."""

    def __init__(self) -> None:
        self._text = ""

    def text(self, text: str) -> bytes:
        self._text += text
        return self._frame({"text": self._text})

    def done(self, event: Done) -> None:
        return None

    def error(self, exc: TokenrelayError) -> bytes:
        return self._frame({"text": self._text, **exc.body()})

    def ping(self) -> None:
        return None

    def end(self) -> None:
        return None

    @staticmethod
    def _frame(payload: dict[str, Any]) -> bytes:
        return (json.dumps(payload, ensure_ascii=False) + "\0").encode()
