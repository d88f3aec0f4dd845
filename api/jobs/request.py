"""The body of `POST /v1/jobs`: a chat completion request plus Replicate-style webhook fields."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tokenrelay.api.openai.field_support import refused
from tokenrelay.api.openai.schema import ChatCompletionRequest
from tokenrelay.api.webhooks.policy import MAX_URL_LENGTH, WebhookTarget, check_submission
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.settings import Settings


class JobRequest(ChatCompletionRequest):
    """A chat completion to run in the background; poll it, stream it, or have it call back.

    A job's result is text: tool calls are parsed by `POST /v1/chat/completions` only."""

    tools: Any = refused("a job's result is text; call tools through /v1/chat/completions")
    tool_choice: Any = refused("a job's result is text; call tools through /v1/chat/completions")
    parallel_tool_calls: Any = refused(
        "a job's result is text; call tools through /v1/chat/completions"
    )

    webhook: str | None = Field(
        default=None,
        max_length=MAX_URL_LENGTH,
        description=(
            "http(s) URL to POST the job record to, signed (Standard Webhooks headers "
            "`webhook-id`, `webhook-timestamp`, `webhook-signature`); its host must be on "
            "the gateway's allow-list."
        ),
    )
    webhook_events_filter: list[Literal["start", "completed"]] | None = Field(
        default=None,
        description=(
            "Which transitions to deliver: `start` (a worker took the job), `completed` "
            "(any terminal status). Default: both."
        ),
    )

    def webhook_target(self, settings: Settings) -> WebhookTarget | None:
        """The checked webhook, None without one; raises `InvalidRequest` (400)."""
        if self.webhook is None:
            if self.webhook_events_filter is not None:
                raise InvalidRequest(
                    "`webhook_events_filter` needs a `webhook` to deliver to",
                    param="webhook_events_filter",
                )
            return None
        return check_submission(settings, self.webhook, self.webhook_events_filter)
