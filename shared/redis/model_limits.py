"""What a model's workers tell the API nodes, so that a prompt that can never fit is refused
at admission rather than by the worker that takes it after it waited in the queue.

A worker publishes, with every heartbeat, its model's context window, its batch's token
budget (`TOKENRELAY_WORKER_MAX_BATCH_TOKENS`) and the SHA-256 of its tokenizer, whose JSON
(`tokenizers`' own format, a few MB) it stores once under that hash. Both keys expire an
hour after the last heartbeat, so a model nobody serves any more leaves nothing behind (the
API then skips its check and the worker that takes a job still makes it). Workers of one model
are expected to share their settings (one ConfigMap in the Helm chart): the latest heartbeat
wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import redis
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
            )
        except (KeyError, ValueError):
            return None


class LimitsPublisher:
    """The worker's side: `publish()` on every heartbeat; the tokenizer's JSON is sent only
    while Redis lacks it (first heartbeat, or after Redis lost its data)."""

    def __init__(
        self, model: str, context_tokens: int, batch_tokens: int, tokenizer_json: str | None
    ) -> None:
        self._model = model
        self._tokenizer_json = tokenizer_json
        sha = hashlib.sha256(tokenizer_json.encode()).hexdigest() if tokenizer_json else ""
        self.limits = ModelLimits(context_tokens, batch_tokens, sha)

    def publish(self, client: redis.Redis) -> None:
        tokenizer_key = keys.tokenizer(self.limits.tokenizer_sha256)
        if self._tokenizer_json is not None and not client.expire(tokenizer_key, LIMITS_TTL_S):
            client.set(tokenizer_key, self._tokenizer_json, ex=LIMITS_TTL_S)
        limits_key = keys.model_limits(self._model)
        pipe = client.pipeline(transaction=False)
        pipe.hset(limits_key, mapping=self.limits.to_hash())
        pipe.expire(limits_key, LIMITS_TTL_S)
        pipe.execute()
