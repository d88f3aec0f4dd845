"""A model-free engine for benchmarks: every sequence emits one token per
`1 / TOKENRELAY_SYNTHETIC_TOKENS_PER_S` seconds after a first-token delay, through the same
batcher, Redis and API path as a real model, so the plumbing can be measured apart from
the model. In lockstep (the default) it decodes as a batched engine does: one step every
interval gives every running sequence its next token, and a new sequence's first token
comes from the first step after its delay; otherwise each sequence keeps its own phase.
Token `n` of a sequence has id `n`, so `stop_token_ids` end it there (the other sampling
controls have no logits to act on), and each token's log probability is 0. Only runs when
`TOKENRELAY_ENGINE=synthetic` and `TOKENRELAY_ALLOW_SYNTHETIC_ENGINE=1` are both set: it
serves no real text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tokenrelay.shared.errors import GenerationFailed, InvalidRequest
from tokenrelay.shared.generation import ChatMessage, FunctionTool
from tokenrelay.shared.redis.model_limits import ChatTemplate
from tokenrelay.worker.engines.protocol import (
    GRAMMAR_CANNOT_CONTINUE,
    IncrementalDecoder,
    SamplingParams,
    TokenOutput,
)

_VOCAB = ("lorem ", "ipsum ", "dolor ", "sit ", "amet ", "consectetur ", "adipiscing ", "elit ")


@dataclass
class _Row:
    params: SamplingParams
    next_due: float
    produced: int = 0


class _WordDecoder:
    def step(self, token_id: int) -> str:
        return _VOCAB[token_id % len(_VOCAB)]


class SyntheticEngine:
    device = "none"
    max_context_tokens = 1 << 20
    vocab_size = 1 << 20

    def __init__(
        self,
        tokens_per_s: float,
        first_token_ms: float,
        lockstep: bool = True,
        arrivals: threading.Event | None = None,
    ) -> None:
        """`arrivals` is set when a job is submitted (`Batcher.arrivals`): a step waiting for
        its next due token returns at once then, so the batcher adds the job now."""
        self._arrivals = arrivals or threading.Event()
        self._interval_s = 1.0 / tokens_per_s
        self._first_token_s = first_token_ms / 1000
        self._lockstep = lockstep
        self._next_tick = 0.0
        self._rows: dict[str, _Row] = {}

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool] = ()
    ) -> list[int]:
        return [len(word) for m in messages for word in m.content.split()] or [0]

    def encode_prompt(self, prompt: str) -> list[int]:
        return [len(word) for word in prompt.split()] or [0]

    def sampling_defaults(self) -> tuple[float, float, int]:
        return (1.0, 1.0, 0)

    def new_decoder(self) -> IncrementalDecoder:
        return _WordDecoder()

    def token_bytes(self, token_id: int) -> bytes:
        return _VOCAB[token_id % len(_VOCAB)].encode()

    def compile_grammar(self, json_schema: str, tool_call: bool = False) -> object:
        field = "tool_choice" if tool_call else "response_format"
        raise InvalidRequest(
            f"`{field}` cannot be enforced by the synthetic engine (it has no vocabulary)",
            param=field,
        )

    def continue_grammar(self, grammar: object, delivered: Sequence[int]) -> object:
        raise GenerationFailed(GRAMMAR_CANNOT_CONTINUE)

    def tokenizer_json(self) -> str | None:
        return None

    def chat_template(self) -> ChatTemplate | None:
        return None

    def add(self, seq_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self._rows[seq_id] = _Row(params, time.monotonic() + self._first_token_s)

    def remove(self, seq_id: str) -> None:
        self._rows.pop(seq_id, None)

    def step(self) -> list[TokenOutput]:
        """Tokens of every sequence that is due; waits for the next due one, or a new job."""
        if not self._rows:
            return []
        now = time.monotonic()
        next_due = min(row.next_due for row in self._rows.values())
        if next_due > now:
            if self._arrivals.wait(next_due - now):
                self._arrivals.clear()
            now = time.monotonic()
        if self._lockstep:
            self._tick(now)
        outputs: list[TokenOutput] = []
        for seq_id, row in list(self._rows.items()):
            if row.next_due > now:
                continue
            row.produced += 1
            row.next_due = self._next_tick if self._lockstep else row.next_due + self._interval_s
            if row.produced in row.params.stop_token_ids and row.produced > row.params.min_tokens:
                outputs.append(TokenOutput(seq_id, None, "stop"))
                del self._rows[seq_id]
                continue
            done = row.produced >= row.params.max_tokens
            logprob = None if row.params.logprobs is None else (0.0, ())
            outputs.append(TokenOutput(seq_id, row.produced, "length" if done else None, logprob))
            if done:
                del self._rows[seq_id]
        return outputs

    def _tick(self, now: float) -> None:
        """Move the batch's decode tick past `now`: a sequence's next token is due at it."""
        if self._next_tick <= now:
            self._next_tick += self._interval_s
            if self._next_tick <= now:  # the batch was idle or fell behind
                self._next_tick = now + self._interval_s
