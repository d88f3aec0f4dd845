"""The linear layers of one Qwen2-0.5B step, per kernel, rows and torch threads, in-process.

One "step" is every projection of the shape once (24 layers x q, k, v, o, gate, up, down,
then the tied output head): 494 M weights, 1.98 GB in float32, 0.99 GB in bfloat16. Each
kernel runs that step on its own copy of random weights for `--rows` input rows (1, 8 and 32
are decode batches, 128 a lone prompt's prefill), in interleaved rounds with float32's plain
`F.linear` as the same-run peer; the table gives ms per step (min / median over rounds), the
weights read per second at the min, and the GFLOP/s.

Kernels: `float32` and `bfloat16` are torch's plain `F.linear`; `bf16-packed` is oneDNN's
linear on weights reordered once into its blocked layout (`mkldnn._reorder_linear_weight`,
no row-count hint, then `mkldnn._linear_pointwise`: what inductor's freezing pass emits for a
CPU linear); `bf16-packed-hint` reorders for the step's own row count.

    .venv/bin/python -m bench.probes.lone_stream.kernels [--rows 1,8,32,128] [--threads 2,1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from bench.common import log

HIDDEN, INTERMEDIATE, LAYERS, KV_WIDTH, VOCAB = 896, 4864, 24, 128, 151936
KERNELS = ("float32", "bfloat16", "bf16-packed", "bf16-packed-hint")

#: (out_features, in_features, has bias) of one layer's projections.
_LAYER = (
    (HIDDEN, HIDDEN, True),
    (KV_WIDTH, HIDDEN, True),
    (KV_WIDTH, HIDDEN, True),
    (HIDDEN, HIDDEN, False),
    (INTERMEDIATE, HIDDEN, False),
    (INTERMEDIATE, HIDDEN, False),
    (HIDDEN, INTERMEDIATE, False),
)

Step = Callable[[dict[int, torch.Tensor]], None]
Layer = tuple[torch.Tensor, torch.Tensor | None, int]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.lone_stream.kernels")
    parser.add_argument("--rows", default="1,8,32,128")
    parser.add_argument("--threads", default="2,1")
    parser.add_argument(
        "--kernels", default="float32,bfloat16,bf16-packed", help=f"of {', '.join(KERNELS)}"
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    kernels = args.kernels.split(",")
    shapes = [shape for _ in range(LAYERS) for shape in _LAYER] + [(VOCAB, HIDDEN, False)]
    weights = sum(out * inp for out, inp, _ in shapes)
    base = {dtype: _weights(shapes, dtype) for dtype in {_dtype(k) for k in kernels}}
    steps = _steps(kernels, rows, base)
    inputs = {
        (k, m): {inp: torch.randn(m, inp).to(_dtype(k)) for inp in (HIDDEN, INTERMEDIATE)}
        for k in kernels
        for m in rows
    }
    times: dict[tuple[int, str, int], list[float]] = {}
    loads = []
    with torch.inference_mode():
        for step_key, step in steps.items():  # warm-up: oneDNN builds its primitives
            step(inputs[step_key])
        for round_index in range(args.rounds):
            for count in threads:
                torch.set_num_threads(count)
                for (kernel, m), step in steps.items():
                    start = time.perf_counter()
                    step(inputs[kernel, m])
                    times.setdefault((count, kernel, m), []).append(time.perf_counter() - start)
            loads.append(os.getloadavg()[0])
            log(f"round {round_index + 1}/{args.rounds}, load {loads[-1]:.1f}")
    print(f"Qwen2-0.5B step's linears ({weights / 1e6:.0f} M weights), ", end="")
    print(f"load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| threads | rows | kernel | ms min / median | GB/s at min | GFLOP/s at min |")
    print("|---:|---:|---|---|---:|---:|")
    for (count, kernel, m), values in times.items():
        best = min(values)
        size = 4 if kernel == "float32" else 2
        print(
            f"| {count} | {m} | {kernel} | {best * 1e3:.1f} / "
            f"{statistics.median(values) * 1e3:.1f} | {weights * size / best / 1e9:.1f} "
            f"| {2 * m * weights / best / 1e9:.0f} |"
        )
    return 0


def _dtype(kernel: str) -> torch.dtype:
    return torch.float32 if kernel == "float32" else torch.bfloat16


def _weights(shapes: list[tuple[int, int, bool]], dtype: torch.dtype) -> list[Layer]:
    """Random (weight, bias, in_features) per projection, one copy per dtype."""
    return [
        (torch.randn(out, inp).to(dtype), torch.randn(out).to(dtype) if bias else None, inp)
        for out, inp, bias in shapes
    ]


def _steps(kernels: list[str], rows: list[int], base: dict[torch.dtype, list[Layer]]) -> dict:
    """One step per (kernel, rows); the unhinted packed weights are shared by all rows."""
    steps: dict[tuple[str, int], Step] = {}
    packed: dict[int | None, list[Layer]] = {}
    for kernel in kernels:
        for m in rows:
            layers = base[_dtype(kernel)]
            if kernel in ("float32", "bfloat16"):
                steps[kernel, m] = _plain(layers)
                continue
            hint = m if kernel == "bf16-packed-hint" else None
            if hint not in packed:
                reorder = torch.ops.mkldnn._reorder_linear_weight
                packed[hint] = [(reorder(w, hint), b, inp) for w, b, inp in layers]
            steps[kernel, m] = _onednn(packed[hint])
    return steps


def _plain(layers: list[Layer]) -> Step:
    linear = torch.nn.functional.linear

    def step(x: dict[int, torch.Tensor]) -> None:
        for weight, bias, inp in layers:
            linear(x[inp], weight, bias)

    return step


def _onednn(layers: list[Layer]) -> Step:
    pointwise = torch.ops.mkldnn._linear_pointwise

    def step(x: dict[int, torch.Tensor]) -> None:
        for weight, bias, inp in layers:
            pointwise(x[inp], weight, bias, "none", [], "")

    return step


if __name__ == "__main__":
    raise SystemExit(main())
