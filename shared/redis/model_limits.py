"""What a model's workers tell the API nodes, so that a prompt that can never fit is refused
at admission rather than by the worker that takes it after it waited in the queue.

A worker publishes, with every heartbeat, its model's context window, its batch's token
budget (`TOKENRELAY_WORKER_MAX_BATCH_TOKENS`) and the SHA-256 of its tokenizer, whose JSON
(`tokenizers`' own format, a few MB) it stores once under that hash, and of its chat template
(`ChatTemplate`), stored the same way: with both, an API node counts a chat's prompt tokens
exactly as the worker will (`POST /v1/messages/count_tokens`). It publishes beside them
the tool-call parser its model's replies need (`TOKENRELAY_TOOL_CALL_PARSER`), which the API
uses for that model, and the block size of its prompts' routing hashes (placement by prefix:
`shared.redis.placement`). Both keys expire an
hour after the last heartbeat, so a model nobody serves any more leaves nothing behind (the
API then skips its check and the worker that takes a job still makes it). Workers of one model
are expected to share their settings (one ConfigMap in the Helm chart): the latest heartbeat
wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis
from pydantic import BaseModel, ConfigDict
from redis.typing import EncodableT, FieldT

from tokenrelay.shared.errors import ContextLengthExceeded
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.replies import as_text

#: Seconds the published limits and tokenizer outlive the last heartbeat that renewed them.
LIMITS_TTL_S = 3600


@dataclass(frozen=True)
class ModelLimits:
    context_tokens: int
    batch_tokens: int
    #: "" when the worker's engine has no tokenizer to share (the synthetic engine).
    tokenizer_sha256: str = ""
    #: "" when it has no chat template to share (the synthetic engine, older workers).
    chat_template_sha256: str = ""
    #: How the API reads tool calls out of this model's replies (`TOKENRELAY_TOOL_CALL_PARSER`
    #: of its workers); "" from older workers.
    tool_call_parser: str = ""
    #: Tokens per block of the prompts' routing hashes (`TOKENRELAY_PREFIX_PLACEMENT_BLOCK_TOKENS`
    #: of its workers: `shared.redis.placement`); 0 from older workers (no placement).
    prefix_block_tokens: int = 0

    @property
    def tokens_per_job(self) -> int:
        """Most tokens (prompt + `max_tokens`) one job may need."""
        return min(self.context_tokens, self.batch_tokens)

    def check_fits(
        self, prompt_tokens: int, max_tokens: int, where: str, *, at_least: bool = False
    ) -> None:
        """Raise `ContextLengthExceeded` (400, `param` = `where`) when the prompt's tokens plus
        `max_tokens` exceed the context window or the batch budget; `at_least` says the
        prompt's count is a lower bound (the API's, without the chat template)."""
        needed = prompt_tokens + max_tokens
        asks = (
            f"{'at least ' if at_least else ''}{needed} tokens ({prompt_tokens} in the {where}, "
            f"{max_tokens} for the completion)"
        )
        if needed > self.context_tokens:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {self.context_tokens} tokens; the "
                f"request asks for {asks}: shorten the {where} or lower `max_tokens`",
                param=where,
            )
        if needed > self.batch_tokens:
            raise ContextLengthExceeded(
                f"the request needs {asks} but a worker's batch holds at most "
                f"{self.batch_tokens} (TOKENRELAY_WORKER_MAX_BATCH_TOKENS)",
                param=where,
            )

    def to_hash(self) -> dict[FieldT, EncodableT]:
        return {
            "context_tokens": self.context_tokens,
            "batch_tokens": self.batch_tokens,
            "tokenizer_sha256": self.tokenizer_sha256,
            "chat_template_sha256": self.chat_template_sha256,
            "tool_call_parser": self.tool_call_parser,
            "prefix_block_tokens": self.prefix_block_tokens,
        }

    @classmethod
    def from_hash(cls, fields: Mapping[str | bytes, str | bytes]) -> ModelLimits | None:
        """The limits in a hash `to_hash` wrote; None for an empty (never published) hash
        or one that does not hold them."""
        text = {as_text(k): as_text(v) for k, v in fields.items()}
        try:
            return cls(
                context_tokens=int(text["context_tokens"]),
                batch_tokens=int(text["batch_tokens"]),
                tokenizer_sha256=text.get("tokenizer_sha256", ""),
                chat_template_sha256=text.get("chat_template_sha256", ""),
                tool_call_parser=text.get("tool_call_parser", ""),
                prefix_block_tokens=int(text.get("prefix_block_tokens", 0)),
            )
        except (KeyError, ValueError):
            return None


class ChatTemplate(BaseModel):
    """A model's chat template as its workers apply it (transformers' `apply_chat_template`):
    the Jinja sources by name (one `default`, and a `tool_use` one where the model has a
    template of its own for tools) and the special tokens transformers passes the template."""

    model_config = ConfigDict(frozen=True)

    templates: dict[str, str]
    special_tokens: dict[str, str | list[str]] = {}

    def source(self, tools: bool) -> str | None:
        """The template transformers picks for a chat with or without `tools`; None where it
        has none to pick (transformers refuses to render then)."""
        if tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        return self.templates.get("default")


class LimitsPublisher:
    """The worker's side: `publish()` on every heartbeat; the tokenizer's JSON and the chat
    template are sent only while Redis lacks them (first heartbeat, or after Redis lost its
    data)."""

    def __init__(
        self,
        model: str,
        context_tokens: int,
        batch_tokens: int,
        tokenizer_json: str | None,
        chat_template: ChatTemplate | None = None,
        tool_call_parser: str = "",
        prefix_block_tokens: int = 0,
    ) -> None:
        self._model = model
        self._blobs: dict[str, str] = {}
        tokenizer_sha = self._add(keys.tokenizer, tokenizer_json)
        template_json = chat_template.model_dump_json() if chat_template is not None else None
        template_sha = self._add(keys.chat_template, template_json)
        self.limits = ModelLimits(
            context_tokens,
            batch_tokens,
            tokenizer_sha,
            template_sha,
            tool_call_parser,
            prefix_block_tokens,
        )

    def _add(self, key: Callable[[str], str], blob: str | None) -> str:
        """Keep `blob` to publish under `key(its SHA-256)`; returns the hash ("" for none)."""
        if not blob:
            return ""
        sha256 = hashlib.sha256(blob.encode()).hexdigest()
        self._blobs[key(sha256)] = blob
        return sha256

    def publish(self, client: redis.Redis) -> None:
        for blob_key, blob in self._blobs.items():
            if not client.expire(blob_key, LIMITS_TTL_S):
                client.set(blob_key, blob, ex=LIMITS_TTL_S)
        limits_key = keys.model_limits(self._model)
        pipe = client.pipeline(transaction=False)
        pipe.hset(limits_key, mapping=self.limits.to_hash())
        pipe.expire(limits_key, LIMITS_TTL_S)
        pipe.execute()
