"""The validated generation request that the API enqueues and the worker runs."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolCall(BaseModel):
    """A function call of an assistant turn; `arguments` is the JSON text the model wrote."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str


class ChatMessage(BaseModel):
    """One turn: an assistant turn may carry `tool_calls`, a `tool` turn answers the call
    `tool_call_id` names."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def template_form(self) -> dict[str, Any]:
        """The turn as chat templates take it, for the worker's tokenizer and the API's count
        alike: Hugging Face's convention has a tool call's `arguments` as an object (Qwen2's
        template writes it with `tojson`)."""
        turn: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            turn["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments(call.arguments)},
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            turn["tool_call_id"] = self.tool_call_id
        return turn


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class FunctionTool(BaseModel):
    """A function the model may call, as the chat template renders it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str | None = None
    #: The JSON schema of the function's arguments.
    parameters: dict[str, Any] = Field(default_factory=dict)

    def template_form(self) -> dict[str, Any]:
        """OpenAI's tool shape, which chat templates (Qwen2's among them) render."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


class GenerationRequest(BaseModel):
    """One generation, already checked against the settings' bounds.

    Either `messages` (a chat, rendered by the model's chat template) or `prompt` (raw text,
    for `/v1/completions`) is set.
    `temperature` and `top_p` left `None` take the model's generation defaults;
    `temperature == 0` means greedy decoding; end-of-sequence is suppressed until
    `min_tokens` tokens were generated (vLLM's extension of the OpenAI API), and always with
    `ignore_eos`. `top_k` `None` takes the model's default, 0 disables it. The penalties,
    `logit_bias` (token id -> bias) and `stop_token_ids` are applied per sequence as vLLM
    applies them (`worker.engines.logits_processor`).
    """

    model_config = ConfigDict(frozen=True)

    model: str
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    max_tokens: int
    min_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    seed: int | None = None
    top_k: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = Field(default_factory=dict)
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    #: None: no log probabilities; k >= 0: each token's and its step's k likeliest.
    logprobs: int | None = None
    #: A JSON schema (as JSON text) the output must match, enforced while decoding.
    json_schema: str | None = None
    #: With `json_schema`: the output is one tool call (a forced `tool_choice`), as the model's
    #: tool-call parser reads it: `<tool_call>` + the JSON document + `</tool_call>`, or for
    #: the `json` parser the bare document (`TOKENRELAY_TOOL_CALL_PARSER` of the worker).
    tool_call: bool = False
    #: The functions the chat template offers the model.
    tools: tuple[FunctionTool, ...] = ()
    #: Drop the oldest turns of a chat over the context window (`shared.truncation`): None
    #: follows `TOKENRELAY_TRUNCATE_MESSAGES`; the Responses API's `truncation` sets it.
    truncate: bool | None = None

    def truncating(self, default: bool) -> bool:
        """Whether this chat is truncated, where `default` is the setting's choice."""
        return default if self.truncate is None else self.truncate
