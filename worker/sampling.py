"""Sampling one token from one sequence's logits with its own parameters and generator."""

from __future__ import annotations

import os
from typing import Any

import torch

from worker.engine import SamplingParams


def new_generator(seed: int | None, device: str) -> torch.Generator:
    """A per-sequence generator: same seed, same draws, whatever else shares the batch."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else _random_seed())
    return generator


def sample_token(logits: Any, params: SamplingParams, generator: torch.Generator) -> int:
    logits = logits.float()
    if params.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > params.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _random_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
