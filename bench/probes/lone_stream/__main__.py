"""A lone stream on the worker's transformers engine, in-process: where its time goes.

For each engine variant and torch thread count, in interleaved rounds, one ~128-token chat
decodes
`--new-tokens` tokens alone (as a lone request does behind the gateway): the prefill step
(time to first token in the engine) and the median decode step, min and median over rounds
(min is the least disturbed by other processes on a shared machine). A variant is a dtype
(`float32`, `bfloat16`: the engine as the worker builds it, so bfloat16 on oneDNN's packed
linears where the CPU has them) or `bfloat16-plain` (torch's plain bf16 linears). Then
torch's profiler over `--profile-steps` decode steps of each variant gives each operator's
share, and the same run measures the two limits a lone decode step faces: a memory copy
(GB/s), and the matrix-vector products of one step's weights read once (GB/s).

    .venv/bin/python -m bench.probes.lone_stream [--engines float32,bfloat16] [--threads 2,1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import best_of, ensure_model, log, make_conversations
from bench.worker_throughput.limits import memory_copy_gb_s
from tokenrelay.shared.generation import ChatMessage
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.transformers_engine import TransformersEngine


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.lone_stream")
    parser.add_argument("--shape", default="qwen2-0.5b")
    parser.add_argument(
        "--engines", default="float32,bfloat16", help="of float32, bfloat16, bfloat16-plain"
    )
    parser.add_argument("--threads", default="2,1", help="torch thread counts to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/bench"))
    args = parser.parse_args()
    model_dir = str(ensure_model(args.cache_dir.resolve(), args.shape))
    engines = {name: _engine(model_dir, name) for name in args.engines.split(",")}
    chats = make_conversations(64, 128, "lone", next(iter(engines.values())).tokenizer)
    runs = iter(range(len(chats)))
    threads = [int(t) for t in args.threads.split(",")]
    for engine in engines.values():
        _lone(engine, chats[next(runs)], 4)  # warm-up
    cells: dict[tuple[str, int], list[tuple[float, float]]] = {}
    loads = []
    for round_index in range(args.rounds):
        for count in threads:
            torch.set_num_threads(count)
            for name, engine in engines.items():
                cell = cells.setdefault((name, count), [])
                cell.append(_lone(engine, chats[next(runs)], args.new_tokens))
        loads.append(os.getloadavg()[0])
        log(f"round {round_index + 1}/{args.rounds}, load {loads[-1]:.1f}")
    torch.set_num_threads(threads[0])
    print(f"{args.shape}, load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| engine | torch threads | prefill ms min / median | decode step ms min / median |")
    print("|---|---:|---|---|")
    for (name, count), values in sorted(cells.items()):
        prefill, decode = [v[0] * 1e3 for v in values], [v[1] * 1e3 for v in values]
        print(
            f"| {name} | {count} | {min(prefill):.0f} / {statistics.median(prefill):.0f} "
            f"| {min(decode):.1f} / {statistics.median(decode):.1f} |"
        )
    for name, engine in engines.items():
        print(f"\n{name}: {_profile(engine, chats[next(runs)], args.profile_steps)}")
    print(f"\n{_limits(engines)}")
    return 0


def _engine(model_dir: str, name: str) -> TransformersEngine:
    dtype = name.removesuffix("-plain")
    return TransformersEngine(model_dir, "cpu", dtype, pack_bf16=not name.endswith("-plain"))


def _lone(engine: TransformersEngine, chat: list[dict], new_tokens: int) -> tuple[float, float]:
    """(prefill s, median decode step s) of one chat decoding alone."""
    _add(engine, chat, new_tokens)
    steps = []
    while engine._rows or engine._joiners:
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    return steps[0], statistics.median(steps[1:])


def _add(engine: TransformersEngine, chat: list[dict], new_tokens: int) -> None:
    ids = engine.encode_chat([ChatMessage(role=m["role"], content=m["content"]) for m in chat])
    params = SamplingParams(new_tokens, new_tokens, temperature=0.7, top_p=0.8, top_k=20, seed=1)
    engine.add(f"lone-{id(chat)}", ids, params)


def _profile(engine: TransformersEngine, chat: list[dict], steps: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    _add(engine, chat, steps + 3)
    engine.step()  # prefill
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            engine.step()
    while engine._rows:
        engine.step()
    events: Any = profiler.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    lines = [f"Operators over {steps} decode steps (self CPU share, calls per step):", ""]
    lines += ["| operator | share | calls per step |", "|---|---:|---:|"]
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]:
        share = event.self_cpu_time_total / total
        lines.append(f"| {event.key} | {share:.1%} | {event.count / steps:.0f} |")
    return "\n".join(lines)


def _limits(engines: dict[str, TransformersEngine]) -> str:
    """Memory copy and one decode step's plain matrix-vector products (of the first variant
    whose linears are not packed; `bench.probes.lone_stream.kernels` times every kernel), each the
    best of 5."""
    name, engine = next(((n, e) for n, e in engines.items() if not e.packed_linears), ("", None))
    if engine is None:
        return "Limits: not measured (every variant's linears are packed)."
    weights = [p for p in engine.model.parameters() if p.dim() == 2]
    step_bytes = sum(p.numel() * p.element_size() for p in weights)
    vectors = {p.shape[1]: torch.ones(1, p.shape[1], dtype=p.dtype) for p in weights}
    linear = torch.nn.functional.linear
    with torch.inference_mode():
        gemv_s = best_of(lambda: [linear(vectors[p.shape[1]], p) for p in weights])
    return (
        f"Limits, same run: memory copy {memory_copy_gb_s(step_bytes):.1f} GB/s; one step's "
        f"matrix-vector products in {name} ({step_bytes / 1e9:.2f} GB of weights, embedding "
        f"included) {gemv_s * 1e3:.0f} ms = {step_bytes / gemv_s / 1e9:.1f} GB/s."
    )


if __name__ == "__main__":
    raise SystemExit(main())
