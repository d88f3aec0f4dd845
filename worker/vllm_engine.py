"""vLLM's engine behind the `Engine` protocol (`TOKENRELAY_ENGINE=vllm`).

vLLM's synchronous `LLMEngine`, in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), maps
one-to-one onto the protocol: `add` is `add_request` with the prompt's token ids, `remove`
is `abort_request`, `step` is one scheduling step and one forward pass. vLLM returns token
ids only (`skip_tokenizer_init`, `detokenize=False`, `DELTA` outputs): our tokenizer,
incremental decoder and stop strings stay in charge, as with the transformers engine. It
brings paged attention, prefix caching (on) and, on GPUs, CUDA graphs.

The model's `generation_config.json` defaults are applied by the batcher, as for the
transformers engine, so vLLM is told to use its own neutral defaults (`generation_config=
"vllm"`) and the end-of-sequence ids are passed with every request.

On CPU, vLLM's chunked prefill rewinds a seeded request's generator, which CPU generators
cannot do ("CPU Generator does not use offset" kills the engine). There, chunked prefill is
off and a step's token budget covers the whole context window, so no prompt is ever split;
the window is capped at `TOKENRELAY_VLLM_CPU_MAX_MODEL_LEN` (vLLM's warm-up runs one step of
the full budget: 32,768 tokens of Qwen2-0.5B took over ten minutes on two cores). On GPUs
chunked prefill is on, with `TOKENRELAY_WORKER_MAX_PREFILL_TOKENS` tokens per step.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from tokenrelay.shared.generation import ChatMessage
from tokenrelay.worker.engine import IncrementalDecoder, ModelLoadError, SamplingParams, TokenOutput
from tokenrelay.worker.model_files import ModelFiles, check_reachable

#: vLLM's CPU KV cache in GiB where `VLLM_CPU_KVCACHE_SPACE` is not set (vLLM needs one).
DEFAULT_CPU_KV_CACHE_GIB = "4"


class VllmEngine:
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
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=self.max_context_tokens,
            max_num_seqs=max_sequences,
            enable_prefix_caching=True,
            enable_chunked_prefill=not on_cpu,
            max_num_batched_tokens=(
                max(self.max_context_tokens, max_prefill_tokens) if on_cpu else max_prefill_tokens
            ),
            generation_config="vllm",
            seed=0,
        )
        try:
            self._engine: Any = LLMEngine.from_engine_args(args)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"vLLM could not load model {model_name!r}: {exc}") from exc
        self._stop_ids = frozenset(self._files.eos_ids)

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self._files.encode_chat(messages)

    def encode_prompt(self, prompt: str) -> list[int]:
        return self._files.encode_prompt(prompt)

    def sampling_defaults(self) -> tuple[float, float, int]:
        return self._files.defaults

    def new_decoder(self) -> IncrementalDecoder:
        return self._files.new_decoder()

    def tokenizer_json(self) -> str | None:
        return self._files.tokenizer_json()

    def add(self, seq_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        sampling = VllmSamplingParams(
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            stop_token_ids=sorted(self._stop_ids),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        self._engine.add_request(seq_id, {"prompt_token_ids": prompt_ids}, sampling)

    def remove(self, seq_id: str) -> None:
        self._engine.abort_request([seq_id])

    def step(self) -> list[TokenOutput]:
        outputs: list[TokenOutput] = []
        for result in self._engine.step():
            completion = result.outputs[0]
            token_ids = [int(t) for t in completion.token_ids]
            finish = _finish_reason(completion.finish_reason) if result.finished else None
            if finish == "stop" and token_ids and token_ids[-1] in self._stop_ids:
                token_ids.pop()  # end-of-sequence is no token of the reply
            for i, token_id in enumerate(token_ids):
                last = i == len(token_ids) - 1
                outputs.append(TokenOutput(result.request_id, token_id, finish if last else None))
            if finish is not None and not token_ids:
                outputs.append(TokenOutput(result.request_id, None, finish))
        return outputs


def _finish_reason(reason: str | None) -> Literal["stop", "length"] | None:
    """vLLM's reason in the protocol's terms; an aborted request (`remove`) has none."""
    if reason == "stop":
        return "stop"
    if reason == "length":
        return "length"
    return None
