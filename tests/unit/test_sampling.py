"""Sampling one token: each parameter narrows the draw as it says, and a seed fixes it."""

from __future__ import annotations

import torch

from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.sampling import new_generator, sample_token

VOCAB = 1000


def params(temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> SamplingParams:
    return SamplingParams(8, 0, temperature, top_p, top_k, seed=None)


def draws(logits: torch.Tensor, p: SamplingParams, n: int = 300, seed: int = 1) -> list[int]:
    generator = new_generator(seed, "cpu")
    return [sample_token(logits, p, generator) for _ in range(n)]


def test_temperature_zero_is_argmax() -> None:
    logits = torch.randn(VOCAB)
    assert set(draws(logits, params(temperature=0), n=5)) == {int(logits.argmax())}


def test_top_k_draws_only_from_the_k_highest() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    top = set(torch.topk(logits, 5).indices.tolist())
    seen = set(draws(logits, params(temperature=5.0, top_k=5)))
    assert seen <= top
    assert len(seen) > 1


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.full((VOCAB,), -30.0)
    logits[[3, 7, 11]] = torch.tensor([2.0, 1.5, 1.0]).log() + 10  # probs ~ 4/9, 3/9, 2/9
    for top_k in (0, 50):
        assert set(draws(logits, params(top_p=0.5, top_k=top_k))) == {3, 7}
        assert set(draws(logits, params(top_p=0.3, top_k=top_k), n=50)) == {3}


def test_no_filter_samples_the_whole_softmax() -> None:
    logits = torch.zeros(4)
    assert set(draws(logits, params(), n=200)) == {0, 1, 2, 3}


def test_same_seed_same_draws_and_another_seed_differs() -> None:
    logits = torch.randn(VOCAB, dtype=torch.bfloat16)
    p = params(temperature=1.0, top_p=0.9, top_k=50)
    assert draws(logits, p, n=40, seed=9) == draws(logits, p, n=40, seed=9)
    assert draws(logits, p, n=40, seed=9) != draws(logits, p, n=40, seed=10)
