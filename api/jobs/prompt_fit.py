"""Refuse at admission a request that can never fit: its prompt's tokens plus `max_tokens`
exceed the model's context window or a worker's batch budget, as the model's workers publish
them (`shared.redis.model_limits`). Without this, such a job would wait in the queue only to be
refused by the worker that takes it. (TGI's router and vLLM's server tokenize in front of
their queues for the same reason.)

Counting is free for the common case: a text has at most one token per UTF-8 byte, plus one
for a prefix a normalizer may add, so a request that fits by its byte count is never
tokenized. Nor is one that the byte count proves cannot fit: with a byte-level BPE
tokenizer (Qwen's, GPT-2's) every byte of the text is in some token and no token stands for
more than the vocabulary's longest, so a text has at least `bytes / (longest * shrink)`
tokens, where `shrink` is how much the normalizer can shorten the text (1 without one, 3 for
NFC: Hangul jamo compose three to one). The rest are tokenized with the workers' own
tokenizer (`tokenizers`), message contents only, a count that, less one per text for a merge
across a template boundary, is a lower bound. To both bounds comes what the chat template
adds where the workers publish it (`_template_tokens`: the markup, a default system prompt,
the tools' text), so a short question with `max_tokens` near the context window, the common
mistake, is refused here rather than by the worker after its wait in the queue. The worker
still checks the exact count.

`count` is exact instead: the prompt's tokens as the worker will count them, through the
chat template the workers publish beside their tokenizer (`api.jobs.chat_template`), for
`POST /v1/messages/count_tokens`.

Tokenizing a long text takes memory in proportion (a 1 MB text of one character took an API
process from 80 to 281 MB), so it runs on a dedicated pool of `TOKENIZER_THREADS` threads,
not the default executor that enqueues use: at most that many texts are in memory at
once, however many arrive. After each count the C heap's free pages go back to the
system (glibc's `malloc_trim`), where the allocator would otherwise keep them.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import redis.asyncio
from tokenizers import Encoding, Tokenizer

from tokenrelay.api.jobs.chat_template import ChatTemplateError, render_chat
from tokenrelay.shared.errors import InvalidRequest, ModelUnavailable
from tokenrelay.shared.generation import ChatMessage, GenerationRequest
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.model_limits import ChatTemplate, ModelLimits
from tokenrelay.shared.redis.replies import as_text
from tokenrelay.shared.truncation import always_kept

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a process trusts the limits it read for a model before reading them again.
LIMITS_REFRESH_S = 5.0
#: Threads that tokenize prompts at admission, per API process.
TOKENIZER_THREADS = 1
#: How much a normalizer can shorten a text's UTF-8, for those the byte bound trusts.
_NORMALIZER_SHRINK = {None: 1, "NFC": 3}


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    #: UTF-8 bytes of text per token, at most (including the normalizer's shrink); None
    #: where the tokenizer may drop bytes or normalize otherwise, so no byte bound holds.
    max_bytes_per_token: int | None


class PromptFit:
    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._redis = client
        self._limits: dict[str, tuple[float, ModelLimits | None]] = {}
        #: model → (tokenizer hash, the tokenizer, or None where it could not be loaded).
        self._tokenizers: dict[str, tuple[str, LoadedTokenizer | None]] = {}
        #: model → (chat template hash, the template, or None where it could not be read).
        self._templates: dict[str, tuple[str, ChatTemplate | None]] = {}
        self._loading = asyncio.Lock()
        self._executor = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenizer")

    async def check(self, request: GenerationRequest, *, truncating: bool = False) -> None:
        """Raises `ContextLengthExceeded` (400) for a request no worker could ever run;
        `truncating` counts only the turns truncation keeps (`shared.truncation`)."""
        messages = always_kept(request.messages) if truncating else request.messages
        texts = [m.content for m in messages] or [request.prompt or ""]
        limits = await self._limits_of(request.model)
        if limits is None:
            return
        where = "messages" if request.messages else "prompt"
        sizes = [len(text.encode()) for text in texts]
        markup = await self._template_tokens(request, messages, limits)
        if sum(sizes) + 2 * len(sizes) + markup + request.max_tokens <= limits.tokens_per_job:
            return
        # Each text may merge with the markup on either side of it: one token less per side.
        markup = max(markup - len(texts), 0)
        loaded = await self._tokenizer(request.model, limits.tokenizer_sha256)
        if loaded is None:
            limits.check_fits(markup, request.max_tokens, where, at_least=True)
            return
        if loaded.max_bytes_per_token is not None:
            per_token = loaded.max_bytes_per_token
            least = sum(max(-(-size // per_token) - 1, 0) for size in sizes)
            limits.check_fits(least + markup, request.max_tokens, where, at_least=True)
        encodings = await self._run(_encode_and_trim(loaded.tokenizer, texts))
        least = sum(max(len(encoding.ids) - 1, 0) for encoding in encodings)
        limits.check_fits(least + markup, request.max_tokens, where, at_least=True)

    async def _template_tokens(
        self, request: GenerationRequest, messages: Sequence[ChatMessage], limits: ModelLimits
    ) -> int:
        """The tokens the chat template adds around the messages' contents: its markup, a
        default system prompt, the tools' names, descriptions and schemas, the calls of
        assistant turns. It is the template rendered with every content left empty, which
        one short tokenization counts; 0 for a raw prompt, and where the workers published
        no template (or it cannot render this chat: the worker then decides)."""
        if request.prompt is not None or not messages:
            return 0
        loaded = await self._tokenizer(request.model, limits.tokenizer_sha256)
        template = await self._template(request.model, limits.chat_template_sha256)
        if loaded is None or template is None:
            return 0
        skeleton = [message.model_copy(update={"content": ""}) for message in messages]
        encode, tools = loaded.tokenizer.encode, request.tools

        def count_ids() -> int:
            text = render_chat(template, skeleton, tools)
            return len(encode(text, add_special_tokens=False).ids)

        try:
            return await self._run(count_ids)
        except ChatTemplateError:
            return 0

    async def count(self, request: GenerationRequest) -> int:
        """The prompt's tokens as the worker will count them, chat template included (before
        any truncation: `TOKENRELAY_TRUNCATE_MESSAGES` may drop turns the count includes).
        Raises `ModelUnavailable` (503) until a worker of the model published its tokenizer
        and chat template, `InvalidRequest` (400) where the template refuses the chat."""
        limits = await self._limits_of(request.model)
        tokenizer = template = None
        if limits is not None:
            tokenizer = await self._tokenizer(request.model, limits.tokenizer_sha256)
            template = await self._template(request.model, limits.chat_template_sha256)
        prompt = request.prompt
        if tokenizer is None or (template is None and prompt is None):
            raise ModelUnavailable(
                f"no worker of model {request.model!r} has published its tokenizer and chat "
                "template yet, so its prompts cannot be counted; retry once one runs",
                param="model",
            )
        encode, messages, tools = tokenizer.tokenizer.encode, request.messages, request.tools

        def count_ids() -> int:  # rendering a long chat takes a while too: not on the loop
            text = prompt if prompt is not None else render_chat(template, messages, tools)
            return len(encode(text, add_special_tokens=False).ids)

        try:
            return await self._run(count_ids)
        except ChatTemplateError as exc:
            raise InvalidRequest(str(exc), param="messages") from exc

    async def prompt_ids(self, request: GenerationRequest, at_least: int) -> list[int] | None:
        """The prompt's token ids as the worker will prefill them (`count`'s rendering, before
        any truncation), or None where the workers have not published their tokenizer and
        template, the template refuses the chat, or the prompt has fewer than `at_least`
        tokens. A text of fewer UTF-8 bytes than `at_least` is not tokenized: a byte-level
        tokenizer makes at most one token of each byte."""
        limits = await self._limits_of(request.model)
        if limits is None:
            return None
        tokenizer = await self._tokenizer(request.model, limits.tokenizer_sha256)
        template = await self._template(request.model, limits.chat_template_sha256)
        prompt, messages, tools = request.prompt, request.messages, request.tools
        if tokenizer is None or (template is None and prompt is None):
            return None
        encode, per_token = tokenizer.tokenizer.encode, tokenizer.max_bytes_per_token

        def ids() -> list[int] | None:
            text = prompt if prompt is not None else render_chat(template, messages, tools)
            if per_token is not None and len(text.encode()) < at_least:
                return None
            encoded: list[int] = encode(text, add_special_tokens=False).ids
            return encoded if len(encoded) >= at_least else None

        try:
            return await self._run(ids)
        except ChatTemplateError:
            return None

    async def limits(self, model: str) -> ModelLimits | None:
        """What `model`'s workers published (read again every `LIMITS_REFRESH_S`); None
        before any did."""
        return await self._limits_of(model)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    async def _limits_of(self, model: str) -> ModelLimits | None:
        read_at, limits = self._limits.get(model, (float("-inf"), None))
        if time.monotonic() - read_at < LIMITS_REFRESH_S:
            return limits
        fields = await self._redis.hgetall(keys.model_limits(model))  # type: ignore[misc]
        limits = ModelLimits.from_hash(fields)
        self._limits[model] = (time.monotonic(), limits)
        return limits

    async def _tokenizer(self, model: str, sha256: str) -> LoadedTokenizer | None:
        if not sha256:
            return None
        async with self._loading:
            cached = self._tokenizers.get(model)
            if cached is not None and cached[0] == sha256:
                return cached[1]
            blob = await self._redis.get(keys.tokenizer(sha256))
            if blob is None:
                return None
            text = as_text(blob)
            loaded: LoadedTokenizer | None = None
            try:
                loaded = await self._run(lambda: _load(text))
            except Exception as exc:  # a format this `tokenizers` cannot read: skip the check
                log.warning("cannot load the tokenizer of model %r: %s", model, exc)
            self._tokenizers[model] = (sha256, loaded)
            return loaded

    async def _template(self, model: str, sha256: str) -> ChatTemplate | None:
        if not sha256:
            return None
        cached = self._templates.get(model)
        if cached is not None and cached[0] == sha256:
            return cached[1]
        blob = await self._redis.get(keys.chat_template(sha256))
        if blob is None:
            return None
        try:
            template: ChatTemplate | None = ChatTemplate.model_validate_json(as_text(blob))
        except ValueError as exc:  # a newer worker's format: no exact counts here
            log.warning("cannot read the chat template of model %r: %s", model, exc)
            template = None
        self._templates[model] = (sha256, template)
        return template


def _load(text: str) -> LoadedTokenizer:
    return LoadedTokenizer(Tokenizer.from_str(text), _max_bytes_per_token(json.loads(text)))


def _max_bytes_per_token(spec: dict[str, object]) -> int | None:
    """The bound for a byte-level BPE whose normalizer is known; None for any other."""
    model, normalizer = spec.get("model"), spec.get("normalizer")
    normalizer_type = normalizer.get("type") if isinstance(normalizer, dict) else normalizer
    if normalizer_type not in _NORMALIZER_SHRINK or not isinstance(model, dict):
        return None
    if model.get("type") != "BPE" or not _keeps_every_byte(spec.get("pre_tokenizer")):
        return None
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        return None
    # A byte-level token's characters stand for one byte each; added tokens are plain text.
    longest = max(len(token) for token in vocab)
    added = spec.get("added_tokens")
    for token in added if isinstance(added, list) else []:
        longest = max(longest, len(str(token.get("content", "")).encode()))
    return longest * _NORMALIZER_SHRINK[normalizer_type]


def _keeps_every_byte(pre_tokenizer: object) -> bool:
    """ByteLevel, alone or after splits that keep what they split on."""
    if not isinstance(pre_tokenizer, dict):
        return False
    steps = (
        pre_tokenizer.get("pretokenizers")
        if pre_tokenizer.get("type") == "Sequence"
        else [pre_tokenizer]
    )
    if not isinstance(steps, list) or not steps:
        return False
    *splits, last = steps
    return last.get("type") == "ByteLevel" and all(
        step.get("type") == "Split" and step.get("behavior") != "Removed" for step in splits
    )


def _encode_and_trim(tokenizer: Tokenizer, texts: list[str]) -> Callable[[], list[Encoding]]:
    def work() -> list[Encoding]:
        try:
            return tokenizer.encode_batch(texts, add_special_tokens=False)
        finally:
            _trim_heap()

    return work


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system, where glibc provides the call."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()
