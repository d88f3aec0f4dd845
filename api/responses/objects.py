"""What the Responses API answers: the response object, its output items and usage, in
OpenAI's shapes; and the part of a response fixed at its creation (`ResponseShell`), which a
stored response keeps so that any API process renders it alike."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from tokenrelay.api.responses.conversation import Plan
from tokenrelay.api.responses.schema import ResponseRequest
from tokenrelay.shared.events import TokenLogprob, Usage

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprob] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextPart]


class FunctionCall(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str
    namespace: str | None = Field(
        default=None, description="The `namespace` tool group the function belongs to."
    )


OutputItem = OutputMessage | FunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Prompt tokens a worker's prefix cache held.")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        return cls(
            input_tokens=usage.prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
            output_tokens=usage.completion_tokens,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=usage.total_tokens,
        )


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class TextSettings(BaseModel):
    format: dict[str, Any] = Field(default_factory=lambda: {"type": "text"})


class Echo(BaseModel):
    """The request's parameters as a response echoes them, defaults filled in."""

    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    model: str
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    safety_identifier: str | None = None
    service_tier: str = "default"
    store: bool = True
    background: bool = False
    temperature: float | None = None
    text: TextSettings = Field(default_factory=TextSettings)
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    user: str | None = None

    @classmethod
    def of(cls, request: ResponseRequest) -> Echo:
        fields = request.model_dump(
            mode="json", by_alias=True, exclude_none=True, include=set(cls.model_fields)
        )
        fields["store"] = request.stored
        fields["background"] = request.in_background
        return cls.model_validate(fields)


class ResponseObject(Echo):
    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: ResponseStatus
    completed_at: float | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    output: list[OutputItem]
    usage: ResponseUsage | None = None


class ResponseShell(BaseModel):
    """What a response is from its creation on: its ids, its echoed parameters and how its
    output is rendered (`Plan`)."""

    id: str
    job_id: str
    created_at: float
    echo: Echo
    plan: Plan

    def object(
        self,
        status: ResponseStatus,
        output: list[OutputItem],
        *,
        usage: ResponseUsage | None = None,
        error: ResponseError | None = None,
        incomplete: IncompleteDetails | None = None,
        completed_at: float | None = None,
    ) -> ResponseObject:
        return ResponseObject(
            **dict(self.echo),
            id=self.id,
            created_at=self.created_at,
            status=status,
            output=output,
            usage=usage,
            error=error,
            incomplete_details=incomplete,
            completed_at=completed_at,
        )


class InputItemList(BaseModel):
    """`GET /v1/responses/{id}/input_items`: a page of the response's input items."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class InputTokens(BaseModel):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True
