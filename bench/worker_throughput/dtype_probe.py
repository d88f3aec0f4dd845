"""The dtype probe of the throughput benchmark: the worker's engine in-process, float32
against bfloat16, to pick the faster dtype for every mode."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import log, make_conversations


@dataclass(frozen=True)
class DtypeProbe:
    """Aggregate tokens/s of the tokenrelay engine, in-process, per dtype."""

    tokens_per_s: dict[str, float]

    @property
    def fastest(self) -> str:
        return max(self.tokens_per_s, key=lambda dtype: self.tokens_per_s[dtype])


def probe_dtype(
    model_dir: Path,
    prompt_tokens: int,
    requests: int,
    new_tokens: int,
    repeats: int,
    before_each: Callable[[], None] = lambda: None,
) -> DtypeProbe:
    """Time `requests` sequences x `new_tokens` through `TransformersEngine` (the engine the
    worker runs, without Redis or HTTP) in float32 and bfloat16, rounds alternating between
    the two; the median of `repeats` rounds after one warm-up round each."""
    from tokenrelay.worker.engines.transformers_engine import TransformersEngine

    engines = {
        dtype: TransformersEngine(str(model_dir), device="cpu", dtype=dtype)
        for dtype in ("float32", "bfloat16")
    }
    rates: dict[str, list[float]] = {dtype: [] for dtype in engines}
    for repeat in range(repeats + 1):
        for dtype, engine in engines.items():
            before_each()
            rate = _engine_rate(engine, prompt_tokens, requests, new_tokens, f"{dtype}-{repeat}")
            if repeat:
                rates[dtype].append(rate)
                log(f"dtype probe: {dtype} {rate:.1f} tokens/s")
    return DtypeProbe({dtype: statistics.median(r) for dtype, r in rates.items()})


def _engine_rate(
    engine: Any, prompt_tokens: int, requests: int, new_tokens: int, tag: str
) -> float:
    from tokenrelay.shared.generation import ChatMessage
    from tokenrelay.worker.engines.protocol import SamplingParams

    temperature, top_p, top_k = engine.sampling_defaults()
    params = SamplingParams(new_tokens, new_tokens, temperature, top_p, top_k, seed=0)
    chats = make_conversations(requests, prompt_tokens, f"probe-{tag}", engine.tokenizer)
    prompts = [
        engine.encode_chat([ChatMessage(role=m["role"], content=m["content"]) for m in chat])
        for chat in chats
    ]
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add(f"{tag}-{i}", prompt, params)
    produced = 0
    while outputs := engine.step():
        produced += sum(1 for output in outputs if output.token_id is not None)
    return produced / (time.perf_counter() - started)
