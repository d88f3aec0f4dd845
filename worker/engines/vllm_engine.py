"""vLLM's engine behind the `Engine` protocol (`TOKENRELAY_ENGINE=vllm`).

vLLM's synchronous `LLMEngine`, in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), maps
one-to-one onto the protocol: `add` is `add_request` with the prompt's token ids, `remove`
is `abort_request`, `step` is one scheduling step and one forward pass. vLLM returns token
ids only (`detokenize=False`, `DELTA` outputs): our tokenizer, incremental decoder and stop
strings stay in charge, as with the transformers engine (vLLM loads the tokenizer too, for
its structured outputs: it refuses them under `skip_tokenizer_init`). It
brings paged attention, prefix caching (on) and, on GPUs, CUDA graphs.

The model's `generation_config.json` defaults are applied by the batcher, as for the
transformers engine, so vLLM is told to use its own neutral defaults (`generation_config=
"vllm"`) and the end-of-sequence ids are passed with every request. Penalties, `logit_bias`,
`ignore_eos` and `stop_token_ids` are vLLM's own; log probabilities come from the raw
distribution (`logprobs_mode="raw_logprobs"`), as with the transformers engine; a JSON
schema is enforced by vLLM's structured outputs, on xgrammar with no free whitespace (the
schema is checked with xgrammar when the job is taken, so a bad one is the client's 400).

On CPU, vLLM's chunked prefill rewinds a seeded request's generator, which CPU generators
cannot do ("CPU Generator does not use offset" kills the engine). There, chunked prefill is
off and a step's token budget covers the whole context window, so no prompt is ever split;
the window is capped at `TOKENRELAY_VLLM_CPU_MAX_MODEL_LEN` (vLLM's warm-up runs one step of
the full budget: 32,768 tokens of Qwen2-0.5B took over ten minutes on two cores). So that a
burst of prompts is not prefilled in one long step (every first token waiting for the last
prompt), new prompts are handed to vLLM whole, `TOKENRELAY_WORKER_MAX_PREFILL_TOKENS` prompt
tokens per step (at least one prompt): the pacing chunked prefill gives, without splitting a
prompt. On GPUs chunked prefill is on, with that many tokens per step. Also on CPU, a step
whose rows all have a top-k and a top-p masks them without sorting the vocabulary
(`vllm_top_k`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tokenrelay.shared.errors import GenerationFailed
from tokenrelay.worker.engines import vllm_top_k
from tokenrelay.worker.engines.grammar import grammar_of
from tokenrelay.worker.engines.model_files import ModelFiles, ModelFilesMethods, check_reachable
from tokenrelay.worker.engines.protocol import (
    GRAMMAR_CANNOT_CONTINUE,
    Logprob,
    ModelLoadError,
    SamplingParams,
    TokenOutput,
)
from tokenrelay.worker.engines.token_bytes import TokenBytes

#: vLLM's CPU KV cache in GiB where `VLLM_CPU_KVCACHE_SPACE` is not set (vLLM needs one).
DEFAULT_CPU_KV_CACHE_GIB = "4"
#: The most `top_logprobs` a request may ask (OpenAI's bound).
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class _Structured:
    """What `StructuredOutputsParams` is given: a JSON schema or an EBNF grammar."""

    json: str | None = None
    grammar: str | None = None


class VllmEngine(ModelFilesMethods):
    def __init__(
        self,
        model_name: str,
        device: str = "auto",
        dtype: str = "auto",
        max_prefill_tokens: int = 2048,
        max_sequences: int = 8,
        cpu_max_model_len: int = 4096,
    ) -> None:
        # Both must be set before vLLM is imported: it reads them once.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KV_CACHE_GIB)
        import torch
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        check_reachable(model_name)
        self._files = ModelFiles(model_name)
        on_cpu = device == "cpu"
        context = self._files.max_context_tokens
        self.max_context_tokens = min(context, cpu_max_model_len) if on_cpu else context
        args = EngineArgs(
            model=model_name,
            dtype=dtype,
            max_model_len=self.max_context_tokens,
            max_num_seqs=max_sequences,
            enable_prefix_caching=True,
            enable_chunked_prefill=not on_cpu,
            max_num_batched_tokens=(
                max(self.max_context_tokens, max_prefill_tokens) if on_cpu else max_prefill_tokens
            ),
            generation_config="vllm",
            logprobs_mode="raw_logprobs",
            max_logprobs=MAX_LOGPROBS,
            structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
            seed=0,
        )
        if on_cpu:
            from vllm.v1.sample.ops import topk_topp_sampler

            vllm_top_k.install(topk_topp_sampler)
        try:
            self._engine: Any = LLMEngine.from_engine_args(args)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"vLLM could not load model {model_name!r}: {exc}") from exc
        self._eos_ids = frozenset(self._files.eos_ids)
        #: On CPU, prompts not yet handed to vLLM (ids and vLLM's sampling params), in order.
        self._pending: OrderedDict[str, tuple[list[int], Any]] | None = (
            OrderedDict() if on_cpu else None
        )
        self._max_prefill_tokens = max_prefill_tokens
        #: Each running sequence's stop tokens and `top_logprobs` count.
        self._sequences: dict[str, tuple[frozenset[int], int]] = {}
        self.vocab_size = int(self._engine.model_config.get_vocab_size())
        self._token_bytes = TokenBytes(self._files.tokenizer)

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes(token_id)

    def compile_grammar(self, json_schema: str, tool_call: bool = False) -> object:
        """vLLM's structured-output request: the schema itself, or for a tool call the EBNF
        of the wrapped grammar, once xgrammar (vLLM's backend) has accepted it."""
        grammar = grammar_of(json_schema, tool_call)
        return _Structured(grammar=str(grammar)) if tool_call else _Structured(json=json_schema)

    def continue_grammar(self, grammar: object, delivered: Sequence[int]) -> object:
        raise GenerationFailed(GRAMMAR_CANNOT_CONTINUE)

    def add(self, seq_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self._eos_ids)
        self._sequences[seq_id] = (frozenset(stop_ids), params.logprobs or 0)
        structured = (
            StructuredOutputsParams(json=params.grammar.json, grammar=params.grammar.grammar)
            if isinstance(params.grammar, _Structured)
            else None
        )
        sampling = VllmSamplingParams(
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            repetition_penalty=params.repetition_penalty,
            logit_bias=dict(params.logit_bias) or None,
            ignore_eos=params.ignore_eos,
            stop_token_ids=sorted(stop_ids),
            logprobs=params.logprobs,
            structured_outputs=structured,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        if self._pending is None:
            self._engine.add_request(seq_id, {"prompt_token_ids": prompt_ids}, sampling)
        else:
            self._pending[seq_id] = (prompt_ids, sampling)

    def remove(self, seq_id: str) -> None:
        if self._pending is None or self._pending.pop(seq_id, None) is None:
            self._engine.abort_request([seq_id])
        self._sequences.pop(seq_id, None)

    def _hand_over_pending(self) -> None:
        """Hands vLLM the oldest pending prompts, up to the step's prompt-token budget (the
        first one whatever its length)."""
        budget = self._max_prefill_tokens
        while self._pending:
            seq_id, (prompt_ids, sampling) = next(iter(self._pending.items()))
            if len(prompt_ids) > budget and budget < self._max_prefill_tokens:
                return
            del self._pending[seq_id]
            budget -= len(prompt_ids)
            self._engine.add_request(seq_id, {"prompt_token_ids": prompt_ids}, sampling)

    def step(self) -> list[TokenOutput]:
        if self._pending:
            self._hand_over_pending()
        outputs: list[TokenOutput] = []
        for result in self._engine.step():
            seq_id = result.request_id
            completion = result.outputs[0]
            token_ids = [int(t) for t in completion.token_ids]
            stop_ids, top_count = self._sequences.get(seq_id, (self._eos_ids, 0))
            logprobs = [
                _logprob(t, entry, top_count)
                for t, entry in zip(token_ids, completion.logprobs or (), strict=False)
            ]
            finish = _finish_reason(completion.finish_reason) if result.finished else None
            if finish == "stop" and token_ids and token_ids[-1] in stop_ids:
                token_ids.pop()  # end-of-sequence (or a stop token) is no token of the reply
            for i, token_id in enumerate(token_ids):
                last = i == len(token_ids) - 1
                logprob = logprobs[i] if i < len(logprobs) else None
                outputs.append(TokenOutput(seq_id, token_id, finish if last else None, logprob))
            if finish is not None and not token_ids:
                outputs.append(TokenOutput(seq_id, None, finish))
            if finish is not None:
                # vLLM's own prefix cache hit, told once: on the sequence's last output.
                cached = int(result.num_cached_tokens or 0)
                outputs[-1] = replace(outputs[-1], cached_tokens=cached)
                self._sequences.pop(seq_id, None)
        return outputs


def _finish_reason(reason: str | None) -> Literal["stop", "length"] | None:
    """vLLM's reason in the protocol's terms; an aborted request (`remove`) has none."""
    if reason == "stop":
        return "stop"
    if reason == "length":
        return "length"
    return None


def _logprob(token_id: int, entry: dict[int, Any], top_count: int) -> Logprob:
    """vLLM's per-token entry (token id -> `Logprob(logprob, rank)`: the sampled token and
    the likeliest by rank) in the protocol's form, with the `top_count` likeliest."""
    ranked = sorted(
        ((tid, lp) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= top_count),
        key=lambda item: item[1].rank,
    )
    top = tuple((int(tid), float(lp.logprob)) for tid, lp in ranked)
    chosen = entry.get(token_id)
    return (float(chosen.logprob) if chosen is not None else float("-inf"), top)
