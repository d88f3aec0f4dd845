"""Prefix reuse end to end: multi-turn conversations on 1, 2 and 4 workers, per engine.

A real Redis, one `tokenrelay api` and N `tokenrelay worker` processes (one compute thread
each) on the 0.5B shape with Qwen's tokenizer; chat completions streamed over HTTP. Each row
runs `--conversations` conversations of `--turns` turns (~`--history-tokens` openings, then
~`--turn-tokens` a turn), interleaved round by round, then one cold chat per conversation as
long as its follow-ups. It prints one table: follow-up TTFT p50/p90 against the cold p50, the
prefix hit rate (cached prompt tokens over follow-ups' prompt tokens, from each stream's
usage), jobs per worker (job records) and, on the baseline's worker count, throughput on
distinct prompts; ratios are against the baseline row measured in the same run (the
transformers engine with the prefix cache and placement off, as before the cache), then the
issue's targets, met or missed, and the load average the run saw.

    .venv/bin/python -m bench.prefix [--workers 1,2,4] [--engines transformers,vllm]
        [--conversations 8] [--turns 5] [--history-tokens 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ensure_model, log
from bench.prefix.cluster import Launch, PrefixCluster, Variant
from bench.prefix.pairs import pairs_table, run_pairs
from bench.prefix.report import Row, summarize, table, targets
from bench.prefix.traffic import Prompts, make_prompts, run_conversations, run_distinct


def main() -> int:
    args = _parser().parse_args()
    model_dir = ensure_model(args.cache_dir.resolve(), args.shape)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = make_prompts(
        tokenizer,
        args.conversations,
        args.turns,
        args.history_tokens,
        args.turn_tokens,
        args.reply_tokens,
        args.distinct,
    )
    log_dir = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    launch = Launch(model_dir, args.dtype, args.vllm_python, log_dir)
    log(f"child logs in {log_dir}")
    load_before, started = os.getloadavg(), time.monotonic()
    rows: list[Row] = []
    for variant, baseline in _plan(args):
        rows.append(_row(variant, baseline, launch, prompts, args))
        log("the table so far:\n" + table(rows))
        if args.json:  # after every row: a long run cut short keeps what it measured
            args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2, default=str))
    minutes = (time.monotonic() - started) / 60
    if rows:
        print(_header(args, load_before, os.getloadavg(), minutes))
        print(f"\n{table(rows)}\n\n{targets(rows)}")
    if args.throughput_pairs:
        pairs = run_pairs(
            launch,
            tokenizer,
            args.pair_workers,
            args.throughput_pairs,
            args.distinct,
            args.history_tokens,
            args.reply_tokens,
            args.distinct_concurrency,
            lambda m: log(f"  {m}"),
        )
        print(
            f"\nInterleaved pairs: {args.distinct} distinct ~{args.history_tokens}-token "
            f"prompts, {args.distinct_concurrency} in flight, {args.reply_tokens}-token "
            f"replies; load average {_load(os.getloadavg())} after:\n"
        )
        print(pairs_table(pairs, args.pair_workers))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, one row each")
    parser.add_argument(
        "--vllm-workers", help="the vLLM engine's worker counts (default: --workers)"
    )
    parser.add_argument("--engines", default="transformers,vllm")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--history-tokens", type=int, default=1000)
    parser.add_argument("--turn-tokens", type=int, default=50)
    parser.add_argument("--reply-tokens", type=int, default=16)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="conversation requests in flight (1: one at a time)",
    )
    parser.add_argument("--distinct", type=int, default=16, help="distinct prompts for throughput")
    parser.add_argument("--distinct-concurrency", type=int, default=4)
    parser.add_argument(
        "--baseline-workers",
        type=int,
        default=2,
        help="workers of the baseline row (transformers, cache and placement off); 0: none",
    )
    parser.add_argument(
        "--throughput-pairs",
        type=int,
        default=0,
        help="then this many interleaved distinct-prompt runs, baseline against all on",
    )
    parser.add_argument("--pair-workers", type=int, default=2)
    parser.add_argument("--shape", default="qwen2-0.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    return parser


def _plan(args: argparse.Namespace) -> list[tuple[Variant, bool]]:
    """The rows in order: the baseline first, then each engine on each worker count."""
    plan = []
    if args.baseline_workers:
        plan.append((Variant("transformers", args.baseline_workers, False, False), True))
    for engine in filter(None, args.engines.split(",")):
        if engine == "vllm" and not Path(args.vllm_python).exists():
            log(f"no vLLM environment at {args.vllm_python}: the vLLM rows are skipped")
            continue
        counts = args.vllm_workers if engine == "vllm" and args.vllm_workers else args.workers
        for workers in (int(w) for w in counts.split(",")):
            plan.append((Variant(engine, workers, True, True), False))
    return plan


def _row(
    variant: Variant, baseline: bool, launch: Launch, prompts: Prompts, args: argparse.Namespace
) -> Row:
    log(f"{variant.label}: starting")
    load_at_start = os.getloadavg()[0]
    with PrefixCluster(variant, launch) as cluster:
        traffic = run_conversations(
            cluster, prompts, args.reply_tokens, args.concurrency, lambda m: log(f"  {m}")
        )
        distinct = None
        if variant.engine == "transformers" and variant.workers == args.baseline_workers:
            distinct = run_distinct(cluster, prompts, args.reply_tokens, args.distinct_concurrency)
            log(f"  distinct prompts: {distinct:.2f} jobs/s")
    row = summarize(variant, traffic, distinct, baseline, (load_at_start, os.getloadavg()[0]))
    log(
        f"{variant.label}: follow-up p90 {row.follow_up_p90_s * 1000:.0f} ms, cold p50 "
        f"{row.cold_p50_s * 1000:.0f} ms, hit {row.hit_rate:.1%}, jobs {row.jobs_per_worker}"
    )
    return row


def _header(
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    minutes: float,
) -> str:
    return (
        f"{args.conversations} conversations x {args.turns} turns on {args.shape} "
        f"({args.dtype}, CPU, one compute thread per worker), interleaved round by round, "
        f"{args.concurrency} request(s) in flight: ~{args.history_tokens}-token openings, "
        f"~{args.turn_tokens} tokens a turn, {args.reply_tokens}-token replies; cold chats as "
        f"long as the follow-ups; throughput on {args.distinct} distinct "
        f"~{args.history_tokens}-token prompts at {args.distinct_concurrency} in flight "
        f"(transformers, {args.baseline_workers} workers). {os.cpu_count()} cores; "
        f"load average (1, 5, 15 min) {_load(load_before)} before, {_load(load_after)} after; "
        f"{minutes:.1f} min."
    )


def _load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{value:.2f}" for value in load)


if __name__ == "__main__":
    sys.exit(main())
