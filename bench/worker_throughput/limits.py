"""The two limits a CPU decode step faces, measured in the benchmark's own run: a memory copy
(a lone step reads every weight once) and matrix products at a few row counts (a batched
step is a GEMM per linear), on the 0.5B shape's MLP weight in the run's dtype."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.common import best_of

#: Qwen2-0.5B's hidden and MLP sizes: `up_proj`'s weight.
_HIDDEN, _INTERMEDIATE = 896, 4864
_COPY_BYTES = 1 << 30


@dataclass(frozen=True)
class Limits:
    copy_gb_s: float
    #: GFLOP/s of `linear(rows x hidden, intermediate x hidden)` by row count.
    gemm_gflop_s: dict[int, float]

    def line(self, dtype: str) -> str:
        gemm = ", ".join(
            f"{rate:.0f} GFLOP/s at {rows} rows" for rows, rate in self.gemm_gflop_s.items()
        )
        return (
            f"Limits, same run (torch, this process, between the cells): memory copy "
            f"{self.copy_gb_s:.1f} GB/s; {dtype} GEMM on a {_INTERMEDIATE} x {_HIDDEN} weight: "
            f"{gemm}."
        )


def memory_copy_gb_s(moved_bytes: int) -> float:
    """GB/s of a float32 copy that moves `moved_bytes` (read and write), best of 5."""
    import torch

    source = torch.ones(moved_bytes // 8, dtype=torch.float32)
    target = torch.empty_like(source)
    return source.numel() * 8 / best_of(lambda: target.copy_(source)) / 1e9


def measure_limits(dtype: str, rows: tuple[int, ...] = (1, 32, 256)) -> Limits:
    import torch

    weight = torch.randn(_INTERMEDIATE, _HIDDEN, dtype=getattr(torch, dtype))
    gemm: dict[int, float] = {}
    with torch.inference_mode():
        for count in rows:
            inputs = torch.randn(count, _HIDDEN, dtype=weight.dtype)
            seconds = best_of(partial(_products, inputs, weight))
            gemm[count] = 20 * 2 * count * _HIDDEN * _INTERMEDIATE / seconds / 1e9
    return Limits(copy_gb_s=memory_copy_gb_s(2 * _COPY_BYTES), gemm_gflop_s=gemm)


def _products(inputs: Any, weight: Any) -> None:
    import torch

    for _ in range(20):
        torch.nn.functional.linear(inputs, weight)
