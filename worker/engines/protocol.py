"""The `Engine` seam between the batcher and a model.

An engine decodes many sequences in shared steps. `add` queues a sequence to join at the
next step, `remove` frees its row at once, and `step` runs one decoding step for every
sequence, returning one `TokenOutput` each. A sequence leaves the engine by itself when
it samples end-of-sequence (`finish_reason="stop"`, no token) or reaches `max_tokens`
(`finish_reason="length"`, with its last token). A sequence that asks for log probabilities
gets them from the model's raw distribution: the log-softmax of its logits before penalties,
biases, temperature, top-k and top-p (vLLM's default, `raw_logprobs`). Three engines
implement it: transformers' (`worker.engines.transformers_engine`), vLLM's
(`worker.engines.vllm_engine`, `TOKENRELAY_ENGINE=vllm`) and a model-free one for benchmarks
(`worker.engines.synthetic_engine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from tokenrelay.shared.generation import ChatMessage, FunctionTool
from tokenrelay.shared.redis.model_limits import ChatTemplate

GRAMMAR_CANNOT_CONTINUE = (
    "the worker running this job was lost, and a job under a JSON schema or a forced tool "
    "call cannot continue on this engine (its structured outputs start at a request's first "
    "output token, not past tokens another worker generated)"
)
"""What `Engine.continue_grammar` raises (as `GenerationFailed`) where the engine cannot."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling. `temperature == 0` is greedy; `top_k == 0` disables top-k;
    end-of-sequence (and `stop_token_ids`) cannot be sampled before `min_tokens` tokens,
    and end-of-sequence never with `ignore_eos`. Penalties and biases adjust the logits
    before sampling (`worker.engines.logits_processor`); a token of `stop_token_ids` ends the
    sequence as end-of-sequence does."""

    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    #: None: no log probabilities; k >= 0: each token's, and the k likeliest candidates'.
    logprobs: int | None = None
    #: A grammar from the engine's `compile_grammar`, enforced while decoding; None: none.
    grammar: object = None


#: A token's log probability and its step's likeliest (token id, log probability) pairs.
Logprob = tuple[float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class TokenOutput:
    """One sequence's result of one step: a token, and why it finished, if it did."""

    seq_id: str
    token_id: int | None
    finish_reason: Literal["stop", "length"] | None = None
    logprob: Logprob | None = None
    #: Prompt tokens served from a prefix cache, not prefilled, told on one output of the
    #: sequence (its first in the transformers engine, its last in vLLM's); 0 on the others.
    cached_tokens: int = 0


class IncrementalDecoder(Protocol):
    def step(self, token_id: int) -> str:
        """Text completed by this token; '' while a multi-byte character is still partial."""
        ...


class Engine(Protocol):
    max_context_tokens: int
    #: Token ids are below this (`logit_bias` and `stop_token_ids` are checked against it).
    vocab_size: int
    device: str

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool] = ()
    ) -> list[int]:
        """The chat's prompt ids through the model's chat template, which renders `tools`."""
        ...

    def encode_prompt(self, prompt: str) -> list[int]: ...

    def sampling_defaults(self) -> tuple[float, float, int]:
        """The model's own (temperature, top_p, top_k), used where a request is silent."""
        ...

    def new_decoder(self) -> IncrementalDecoder: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The token's UTF-8 bytes (part of a character, for some), for log probabilities."""
        ...

    def compile_grammar(self, json_schema: str, tool_call: bool = False) -> object:
        """A grammar for `SamplingParams.grammar` that only lets documents valid for
        `json_schema` be generated (with `tool_call`, wrapped in `<tool_call>` ...
        `</tool_call>`); raises `InvalidRequest` where it cannot."""
        ...

    def continue_grammar(self, grammar: object, delivered: Sequence[int]) -> object:
        """`grammar` (from `compile_grammar`) for a continuation (`worker.continuation`): its
        matcher starts past `delivered`, the tokens an earlier worker generated under it.
        Raises `GenerationFailed` where the engine cannot start a grammar part-way, or the
        grammar refuses those tokens."""
        ...

    def tokenizer_json(self) -> str | None:
        """The tokenizer in `tokenizers`' JSON form, for API nodes to count prompt tokens at
        admission (`shared.redis.model_limits`); None where the engine has none to share."""
        ...

    def chat_template(self) -> ChatTemplate | None:
        """The chat template `encode_chat` applies, for API nodes to count a chat's prompt
        tokens exactly (`shared.redis.model_limits`); None where the engine has none."""
        ...

    def add(self, seq_id: str, prompt_ids: list[int], params: SamplingParams) -> None: ...

    def remove(self, seq_id: str) -> None: ...

    def step(self) -> list[TokenOutput]:
        """One forward pass: the token of each sequence it advanced (none while a long
        prompt is only part-way prefilled), and which sequences it finished."""
        ...


class ModelLoadError(RuntimeError):
    """The configured model could not be loaded."""
