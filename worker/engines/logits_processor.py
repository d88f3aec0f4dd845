"""One sequence's adjustments to its logits before sampling, as vLLM applies them.

- `repetition_penalty` (vLLM's and HF's, multiplicative): every token of the prompt or the
  output so far has a positive logit divided by it and a negative one multiplied by it.
- `frequency_penalty` and `presence_penalty` (OpenAI's, additive): minus the penalty times
  how often the token occurs in the output so far, and minus the penalty if it occurs at all.
- `logit_bias` (OpenAI's): added to the token's logit; -100 bans it in practice.
- end-of-sequence (and `stop_token_ids`) get -inf while fewer than `min_tokens` tokens were
  produced; end-of-sequence always with `ignore_eos`.

A sequence that asks for none of these pays nothing: `adjust` returns the row untouched.
Counts are dense tensors of the vocabulary's size, kept only for the penalties asked for.
"""

from __future__ import annotations

import torch

from tokenrelay.worker.engines.protocol import SamplingParams


class LogitsProcessor:
    def __init__(
        self, params: SamplingParams, prompt_ids: list[int], eos_ids: frozenset[int]
    ) -> None:
        self._params = params
        self._prompt_ids = prompt_ids
        self._eos = sorted(eos_ids)
        self._ends = sorted(eos_ids | params.stop_token_ids)
        self._additive = params.frequency_penalty != 0 or params.presence_penalty != 0
        self._repetition = params.repetition_penalty != 1.0
        self._counts: torch.Tensor | None = None
        self._seen: torch.Tensor | None = None
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None

    def adjust(self, logits: torch.Tensor, produced: int) -> torch.Tensor:
        """The logits to sample the next token from (a new tensor when anything changed)."""
        params = self._params
        ban = self._ends if produced < params.min_tokens else self._eos if params.ignore_eos else []
        if not (ban or self._additive or self._repetition or params.logit_bias):
            return logits
        logits = logits.clone()
        if self._repetition:
            seen = self._seen_mask(logits)
            scaled = torch.where(
                logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty
            )
            logits = torch.where(seen, scaled, logits)
        if self._additive:
            counts = self._count_tensor(logits)
            logits -= params.frequency_penalty * counts
            logits -= params.presence_penalty * (counts > 0).to(logits.dtype)
        if params.logit_bias:
            ids, values = self._bias_tensors(logits)
            logits.index_add_(0, ids, values)
        if ban:
            logits[ban] = float("-inf")
        return logits

    def observe(self, token: int) -> None:
        """The token sampled (and kept) from the adjusted logits."""
        if self._counts is not None:
            self._counts[token] += 1
        if self._seen is not None:
            self._seen[token] = True

    def _count_tensor(self, logits: torch.Tensor) -> torch.Tensor:
        if self._counts is None:
            self._counts = torch.zeros_like(logits)
        return self._counts

    def _seen_mask(self, logits: torch.Tensor) -> torch.Tensor:
        if self._seen is None:
            self._seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
            self._seen[torch.tensor(self._prompt_ids, dtype=torch.long, device=logits.device)] = (
                True
            )
        return self._seen

    def _bias_tensors(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._bias is None:
            ids = [token for token, _ in self._params.logit_bias]
            values = [value for _, value in self._params.logit_bias]
            self._bias = (
                torch.tensor(ids, dtype=torch.long, device=logits.device),
                torch.tensor(values, dtype=logits.dtype, device=logits.device),
            )
        return self._bias
