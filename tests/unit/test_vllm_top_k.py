"""The vLLM engine's CPU top-k/top-p mask against vLLM's own rule (`apply_top_k_top_p_pytorch`
of vLLM 0.32, written out below as the reference), on random logits."""

from __future__ import annotations

import types

import pytest
import torch

from tokenrelay.worker.engines.vllm_top_k import install, top_k_top_p

VOCAB = 2_000


def vllm_rule(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM 0.32's sort-based mask: sort the row, cut at the k-th largest, then top-p."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        cut = logits_sort.gather(1, (logits_sort.size(1) - k.to(torch.long)).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < cut, -float("inf"))
    if p is not None:
        probs_sum = torch.cumsum(logits_sort.softmax(dim=-1), dim=-1)
        top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def fail(*_: object) -> torch.Tensor:
    raise AssertionError("the fallback was used")


def random_case(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, generator=generator) * 4
    k = torch.randint(1, 64, (rows,), generator=generator)
    p = torch.rand(rows, generator=generator) * 0.99 + 0.01
    p[::3] = 1.0
    return logits, k, p


@pytest.mark.parametrize("seed", range(5))
def test_the_mask_is_vllms(seed: int) -> None:
    logits, k, p = random_case(32, seed)
    expected = vllm_rule(logits.clone(), k, p)
    got = top_k_top_p(logits.clone(), k, p, fail)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(expected)])
    kept = (~torch.isinf(got)).sum(dim=1)
    assert bool((kept >= 1).all()) and bool((kept <= k).all())


def test_ties_at_the_k_th_logit_are_kept_as_vllm_keeps_them() -> None:
    logits = torch.randn(16, VOCAB, generator=torch.Generator().manual_seed(7)).round()
    k = torch.full((16,), 20)
    p = torch.ones(16)
    expected = vllm_rule(logits.clone(), k, p)
    got = top_k_top_p(logits.clone(), k, p, fail)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert bool(((~torch.isinf(got)).sum(dim=1) > 20).any()), "the case has no ties"


def test_a_row_is_masked_alike_whatever_shares_the_batch() -> None:
    logits, k, p = random_case(8, 11)
    alone = top_k_top_p(logits[:1].clone(), k[:1], p[:1], fail)
    together = top_k_top_p(logits.clone(), k, p, fail)
    assert torch.equal(alone[0], together[0])


@pytest.mark.parametrize("case", ["no top-k", "no top-p", "a row without top-k"])
def test_vllms_own_path_without_a_top_k_and_a_top_p_on_every_row(case: str) -> None:
    logits, k, p = random_case(4, 3)
    used: list[bool] = []

    def fallback(x: torch.Tensor, kk: torch.Tensor | None, pp: torch.Tensor | None) -> torch.Tensor:
        used.append(True)
        return x

    if case == "a row without top-k":
        k[2] = VOCAB
    top_k_top_p(
        logits, None if case == "no top-k" else k, None if case == "no top-p" else p, fallback
    )
    assert used == [True]


def test_install_swaps_the_samplers_function_once() -> None:
    module = types.SimpleNamespace(apply_top_k_top_p=fail)
    install(module)
    install(module)
    logits, k, p = random_case(4, 5)
    expected = vllm_rule(logits.clone(), k, p)
    assert torch.equal(module.apply_top_k_top_p(logits, k, p), expected)
    with pytest.raises(AssertionError, match="fallback"):
        module.apply_top_k_top_p(logits, None, p)
