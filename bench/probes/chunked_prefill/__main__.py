"""What a long prompt does to the streams already running: chunked prefill against one pass.

The worker's engine in-process (no Redis, no HTTP): `--running` sequences decode on the
0.5B shape; once they have produced a few tokens a prompt of `--long-tokens` arrives. For
each `TOKENRELAY_WORKER_MAX_PREFILL_TOKENS` value it prints the running streams' longest
gap between two tokens (the stall the long prompt causes), their median gap, the long
prompt's time to first token, and the whole run's tokens/s. "one pass" puts the whole
prompt in one prefill step, as chunking off would.

    .venv/bin/python -m bench.probes.chunked_prefill [--long-tokens 3000] [--chunks 512,2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import ensure_model, log, make_conversations
from tokenrelay.shared.generation import ChatMessage
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.transformers_engine import TransformersEngine

ONE_PASS = 1 << 20


@dataclass(frozen=True)
class StallRun:
    max_prefill_tokens: int
    max_gap_s: float
    median_gap_s: float
    long_ttft_s: float
    tokens_per_s: float


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.chunked_prefill")
    parser.add_argument("--shape", default="qwen2-0.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--running", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=3000)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--chunks", default="512,2048", help="prefill budgets to compare")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/bench"))
    args = parser.parse_args()
    model_dir = ensure_model(args.cache_dir.resolve(), args.shape)
    budgets = [ONE_PASS, *(int(c) for c in args.chunks.split(","))]
    engines = {
        budget: TransformersEngine(str(model_dir), "cpu", args.dtype, max_prefill_tokens=budget)
        for budget in budgets
    }
    runs = []
    for budget, engine in engines.items():
        _one_run(engine, budget, args, "warm-up")
        runs.append(_one_run(engine, budget, args, "measured"))
        log(f"max_prefill_tokens={_label(budget)}: {runs[-1]}")
    print(_table(runs, args))
    return 0


def _one_run(
    engine: TransformersEngine, budget: int, args: argparse.Namespace, tag: str
) -> StallRun:
    temperature, top_p, top_k = engine.sampling_defaults()
    params = SamplingParams(args.new_tokens, args.new_tokens, temperature, top_p, top_k, seed=0)
    chats = make_conversations(args.running, 128, f"stall-{tag}", engine.tokenizer)
    for i, chat in enumerate(chats):
        messages = [ChatMessage(role=m["role"], content=m["content"]) for m in chat]
        engine.add(f"run-{i}", engine.encode_chat(messages), params)
    long_ids = (engine.encode_prompt("The quick brown fox. ") * args.long_tokens)[
        : args.long_tokens
    ]
    last_token_at: dict[str, float] = {}
    gaps: list[float] = []
    produced, long_added_at, long_first_at = 0, 0.0, 0.0
    started = time.perf_counter()
    finished: set[str] = set()
    while len(finished) < args.running + 1:
        if not long_added_at and produced >= 4 * args.running:
            engine.add("long", long_ids, params)
            long_added_at = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            if output.token_id is not None:
                produced += 1
            if output.seq_id == "long":
                long_first_at = long_first_at or now
            else:
                if output.seq_id in last_token_at and long_added_at:
                    gaps.append(now - last_token_at[output.seq_id])
                last_token_at[output.seq_id] = now
            if output.finish_reason is not None:
                finished.add(output.seq_id)
    return StallRun(
        max_prefill_tokens=budget,
        max_gap_s=max(gaps),
        median_gap_s=statistics.median(gaps),
        long_ttft_s=long_first_at - long_added_at,
        tokens_per_s=produced / (time.perf_counter() - started),
    )


def _label(budget: int) -> str:
    return "one pass" if budget == ONE_PASS else str(budget)


def _table(runs: list[StallRun], args: argparse.Namespace) -> str:
    lines = [
        f"{args.running} sequences decoding on {args.shape} ({args.dtype}, CPU) when a "
        f"{args.long_tokens}-token prompt arrives; gaps are between two tokens of a running "
        "sequence after the arrival.",
        "",
        "| max prefill tokens | longest gap s | median gap s | long prompt TTFT s | tok/s "
        "| longest gap vs one pass |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = runs[0].max_gap_s
    for run in runs:
        lines.append(
            f"| {_label(run.max_prefill_tokens)} | {run.max_gap_s:.2f} | "
            f"{run.median_gap_s:.3f} | {run.long_ttft_s:.2f} | {run.tokens_per_s:.1f} | "
            f"{run.max_gap_s / base:.2f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
