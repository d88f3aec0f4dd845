"""Sampling one token from one sequence's logits with its own parameters and generator.

Top-k first narrows the vocabulary (151,936 ids on Qwen2) to k candidates, and temperature,
softmax and top-p then work on those k alone: sorting and normalising the whole vocabulary
for every row of every step cost as much as a quarter of a CPU decode step.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from tokenrelay.worker.engines.protocol import Logprob, SamplingParams


def new_generator(seed: int | None, device: str) -> torch.Generator:
    """A per-sequence generator: same seed, same draws, whatever else shares the batch."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else _random_seed())
    return generator


def sample_token(logits: Any, params: SamplingParams, generator: torch.Generator) -> int:
    if params.temperature == 0:
        return int(torch.argmax(logits))
    if params.top_k <= 0 or params.top_k >= logits.shape[-1]:
        if params.top_p >= 1.0:
            probs = torch.softmax(logits.float() / params.temperature, dim=-1)
            return int(torch.multinomial(probs, 1, generator=generator))
        values, ids = torch.sort(logits, descending=True)
    else:
        values, ids = torch.topk(logits, params.top_k)
    probs = torch.softmax(values.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        outside = torch.cumsum(probs, dim=-1) - probs > params.top_p
        probs = probs.masked_fill(outside, 0.0)
    return int(ids[torch.multinomial(probs, 1, generator=generator)])


def raw_logprob(logits: Any, token: int, top: int) -> Logprob:
    """`token`'s log probability under the model's raw distribution (log-softmax of the
    logits before any penalty, bias, temperature or filter), and the `top` likeliest."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    candidates: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = torch.topk(logprobs, top)
        candidates = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return float(logprobs[token]), candidates


def _random_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
