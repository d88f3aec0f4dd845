"""Refuse at admission a request that can never fit: its prompt's tokens plus `max_tokens`
exceed the model's context window or a worker's batch budget, as the model's workers publish
them (`shared.model_limits`). Without this, such a job would wait in the queue only to be
refused by the worker that takes it. (TGI's router and vLLM's server tokenize in front of
their queues for the same reason.)

Counting is free for the common case: a text has at most one token per UTF-8 byte, plus one
for a prefix a normalizer may add, so a request that fits by its byte count is never
tokenized. Longer ones are tokenized with the workers' own tokenizer (`tokenizers`, in a
thread), message contents only: the chat template only adds tokens, so the count, less one
per text for a merge across a template boundary, is a lower bound. The worker still checks
the exact count, template included.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio
from tokenizers import Tokenizer

from tokenrelay.shared import keys
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.model_limits import ModelLimits
from tokenrelay.shared.truncation import always_kept

log = logging.getLogger(__name__)

#: How long a process trusts the limits it read for a model before reading them again.
LIMITS_REFRESH_S = 5.0


class PromptFit:
    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._redis = client
        self._limits: dict[str, tuple[float, ModelLimits | None]] = {}
        #: model → (tokenizer hash, the tokenizer, or None where it could not be loaded).
        self._tokenizers: dict[str, tuple[str, Tokenizer | None]] = {}
        self._loading = asyncio.Lock()

    async def check(self, request: GenerationRequest, *, truncating: bool = False) -> None:
        """Raises `ContextLengthExceeded` (400) for a request no worker could ever run;
        `truncating` counts only the turns truncation keeps (`shared.truncation`)."""
        messages = always_kept(request.messages) if truncating else request.messages
        texts = [m.content for m in messages] or [request.prompt or ""]
        limits = await self._limits_of(request.model)
        if limits is None:
            return
        most = sum(len(text.encode()) + 1 for text in texts)
        if most + request.max_tokens <= limits.tokens_per_job:
            return
        tokenizer = await self._tokenizer(request.model, limits.tokenizer_sha256)
        if tokenizer is None:
            return
        encodings = await asyncio.to_thread(tokenizer.encode_batch, texts, add_special_tokens=False)
        least = sum(max(len(encoding.ids) - 1, 0) for encoding in encodings)
        where = "messages" if request.messages else "prompt"
        limits.check_fits(least, request.max_tokens, where, at_least=True)

    async def _limits_of(self, model: str) -> ModelLimits | None:
        read_at, limits = self._limits.get(model, (float("-inf"), None))
        if time.monotonic() - read_at < LIMITS_REFRESH_S:
            return limits
        fields = await self._redis.hgetall(keys.model_limits(model))  # type: ignore[misc]
        limits = ModelLimits.from_hash(fields)
        self._limits[model] = (time.monotonic(), limits)
        return limits

    async def _tokenizer(self, model: str, sha256: str) -> Tokenizer | None:
        if not sha256:
            return None
        async with self._loading:
            cached = self._tokenizers.get(model)
            if cached is not None and cached[0] == sha256:
                return cached[1]
            blob = await self._redis.get(keys.tokenizer(sha256))
            if blob is None:
                return None
            text = blob.decode() if isinstance(blob, bytes) else blob
            tokenizer: Tokenizer | None = None
            try:
                tokenizer = await asyncio.to_thread(Tokenizer.from_str, text)
            except Exception as exc:  # a format this `tokenizers` cannot read: skip the check
                log.warning("cannot load the tokenizer of model %r: %s", model, exc)
            self._tokenizers[model] = (sha256, tokenizer)
            return tokenizer
