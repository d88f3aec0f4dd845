"""Throughput on prompts that share nothing, as interleaved pairs: the baseline (prefix cache
and placement off) against both on, each on its own cluster, both clusters up at once and
measured in turn (A, B, A, B, ...), so a shared machine's changing load falls on both alike.

Pair k sends the same fresh distinct chats to both clusters, so neither has seen them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from bench.common import make_conversations
from bench.prefix.cluster import Launch, PrefixCluster, Variant
from bench.prefix.traffic import Prompts, run_distinct


@dataclass(frozen=True)
class Pair:
    baseline_jobs_per_s: float
    on_jobs_per_s: float

    @property
    def ratio(self) -> float:
        return self.on_jobs_per_s / self.baseline_jobs_per_s


def run_pairs(
    launch: Launch,
    tokenizer: Any,
    workers: int,
    pairs: int,
    jobs: int,
    prompt_tokens: int,
    reply_tokens: int,
    concurrency: int,
    progress: Callable[[str], None],
) -> list[Pair]:
    baseline = Variant("transformers", workers, cache=False, placement=False)
    on = Variant("transformers", workers, cache=True, placement=True)
    results = []
    with ExitStack() as stack:
        clusters = [stack.enter_context(PrefixCluster(v, launch)) for v in (baseline, on)]
        for k in range(pairs):
            chats = make_conversations(jobs, prompt_tokens, f"pair-{k}", tokenizer)
            prompts = Prompts(openings=[], turns=[], cold=[], distinct=chats)
            rates = [run_distinct(c, prompts, reply_tokens, concurrency) for c in clusters]
            results.append(Pair(*rates))
            progress(f"pair {k + 1}/{pairs}: {rates[0]:.3f} vs {rates[1]:.3f} jobs/s")
    return results


def pairs_table(pairs: list[Pair], workers: int) -> str:
    lines = [
        f"| pair | baseline jobs/s ({workers} workers, cache and placement off) "
        "| cache and placement on, jobs/s | on / baseline |",
        "|---:|---:|---:|---:|",
    ]
    for k, pair in enumerate(pairs, 1):
        lines.append(
            f"| {k} | {pair.baseline_jobs_per_s:.3f} | {pair.on_jobs_per_s:.3f} "
            f"| {pair.ratio:.2f}x |"
        )
    lines.append(
        f"| mean | {statistics.mean(p.baseline_jobs_per_s for p in pairs):.3f} "
        f"| {statistics.mean(p.on_jobs_per_s for p in pairs):.3f} "
        f"| {statistics.mean(p.ratio for p in pairs):.2f}x |"
    )
    return "\n".join(lines)
