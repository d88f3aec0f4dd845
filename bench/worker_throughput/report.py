"""The figures of one throughput benchmark run, rendered as markdown tables and targets."""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.worker_throughput.dtype_probe import DtypeProbe
from bench.worker_throughput.limits import Limits
from bench.worker_throughput.profile import StepProfile
from bench.worker_throughput.stats import CellSummary, RequestTiming, RunResult, percentile

MODES: dict[str, str] = {
    "a": "(a) sequential `generate`",
    "b": "(b) thread per request + `TextIteratorStreamer`",
    "c": "(c) `transformers serve --continuous-batching`",
    "d": "(d) tokenrelay: HTTP → Redis/RQ → worker → SSE",
    "e": "(e) tokenrelay with the vLLM engine (`TOKENRELAY_ENGINE=vllm`)",
    "f": "(f) `vllm serve` (vLLM's own OpenAI server)",
}
DEFAULT_MODES = ("a", "b", "c", "d")
TARGET_SHAPE = "qwen2-0.5b"


@dataclass(frozen=True)
class Stagger:
    """A staggered-arrival run: TTFT of requests that arrived while earlier ones streamed."""

    mode: str
    requests: int
    interval_ms: float
    mid_batch: int
    mid_ttft_p50_s: float
    mid_ttft_p99_s: float
    first_ttft_s: float
    tokens_per_s: float
    #: Medians over the mid-batch requests of where their TTFT went (tokenrelay only).
    phases: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def arrivals_mid_batch(run: RunResult) -> list[RequestTiming]:
        """Requests that arrived while an earlier one was still streaming."""
        timings = sorted(run.timings, key=lambda t: t.due_s)
        return [
            t
            for i, t in enumerate(timings)
            if any(earlier.end_s > t.due_s for earlier in timings[:i])
        ]

    @classmethod
    def of(cls, mode: str, run: RunResult, interval_ms: float, phases: dict[str, float]) -> Stagger:
        mid = [t.ttft_s for t in cls.arrivals_mid_batch(run)]
        return cls(
            mode=mode,
            requests=len(run.timings),
            interval_ms=interval_ms,
            mid_batch=len(mid),
            mid_ttft_p50_s=percentile(mid, 0.5),
            mid_ttft_p99_s=percentile(mid, 0.99),
            first_ttft_s=min(run.timings, key=lambda t: t.due_s).ttft_s,
            tokens_per_s=run.tokens_per_s,
            phases=phases,
        )


@dataclass(frozen=True)
class ProcessCpu:
    """CPU seconds each server process used during one run, and the run's wall time."""

    mode: str
    concurrency: int
    wall_s: float
    cpu_s: dict[str, float]


@dataclass
class ShapeReport:
    shape: str
    dtype: str
    probe: DtypeProbe | None = None
    cells: dict[tuple[str, int], CellSummary] = field(default_factory=dict)
    staggers: list[Stagger] = field(default_factory=list)
    profiles: dict[str, StepProfile] = field(default_factory=dict)
    process_cpu: list[ProcessCpu] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: How (c) and (d) were configured, one line each.
    setup: list[str] = field(default_factory=list)
    #: The 1-minute load average after each measured run.
    loads: list[float] = field(default_factory=list)
    limits: Limits | None = None

    def ratio(self, concurrency: int, over: str, ours_mode: str = "d") -> float | None:
        """tokens/s of `ours_mode` (default (d)) over mode `over` at `concurrency`."""
        ours = self.cells.get((ours_mode, concurrency))
        base = self.cells.get((over, concurrency))
        if ours is None or base is None:
            return None
        return ours.tokens_per_s / base.tokens_per_s

    def lone_ttft_s(self, mode: str = "d") -> float | None:
        """`mode`'s TTFT p50 at concurrency 1."""
        cell = self.cells.get((mode, 1))
        return cell.ttft_p50_s if cell else None

    def to_json(self) -> dict:
        return {
            "shape": self.shape,
            "dtype": self.dtype,
            "probe_tokens_per_s": self.probe.tokens_per_s if self.probe else None,
            "cells": [
                {"mode": mode, "concurrency": concurrency, **asdict(cell)}
                for (mode, concurrency), cell in self.cells.items()
            ],
            "staggered": [asdict(s) for s in self.staggers],
            "profiles": {label: asdict(p) for label, p in self.profiles.items()},
            "process_cpu": [asdict(u) for u in self.process_cpu],
            "failures": self.failures,
            "setup": self.setup,
            "loads": self.loads,
            "limits": asdict(self.limits) if self.limits else None,
        }


def render(reports: list[ShapeReport], args: argparse.Namespace) -> str:
    import torch
    import transformers

    concurrencies: list[int] = args.concurrency
    prompt_tokens, new_tokens = args.prompt_tokens, args.new_tokens

    lines = [
        f"Worker throughput, {time.strftime('%Y-%m-%d %H:%M')}: {os.cpu_count()} CPUs "
        f"({platform.machine()}), torch {torch.__version__}, transformers "
        f"{transformers.__version__}, Python {sys.version.split()[0]}; tokenrelay "
        f"{_revision()}. Command: `python -m bench.worker_throughput {' '.join(sys.argv[1:])}`.",
        f"Each request: a distinct ~{prompt_tokens}-token chat, exactly {new_tokens} new "
        "tokens (EOS suppressed), sampled with the model's defaults (temperature 0.7, top_p "
        "0.8, top_k 20). tok/s = all generated tokens / wall time of the run; TTFT from each "
        "request's due time to its first token (a) or first non-empty text (b, c, d). Medians "
        "over the runs; `others` = share of the machine's CPU used by processes outside the "
        "benchmark during the cell.",
        "",
        "| shape | dtype | mode | concurrent | tok/s | TTFT p50 s | TTFT p99 s | runs | others |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for report in reports:
        for concurrency in concurrencies:
            for mode, label in MODES.items():
                cell = report.cells.get((mode, concurrency))
                if cell is None:
                    continue
                uneven = " (uneven lengths!)" if cell.uneven else ""
                lines.append(
                    f"| {report.shape} | {_dtype(report.dtype)} | {label}{uneven} | "
                    f"{concurrency} | {cell.tokens_per_s:.1f} | {cell.ttft_p50_s:.2f} | "
                    f"{cell.ttft_p99_s:.2f} | {cell.runs} | {cell.foreign_cpu:.0%} |"
                )
    for report in reports:
        if report.loads:
            lines += [
                "",
                f"{report.shape}: load average (1 min) after each run "
                f"{min(report.loads):.1f}-{max(report.loads):.1f}.",
            ]
        if report.limits:
            lines += ["", report.limits.line(_dtype(report.dtype))]
    lines += ["", *_ratio_table(reports, concurrencies)]
    if any(key in ("e", "f") for report in reports for key, _ in report.cells):
        lines += ["", *_vllm_table(reports, concurrencies)]
    lines += _lone_stream_lines(reports)
    lines += ["", *_stagger_table(reports)]
    lines += ["", *_targets(reports, args.stagger_ms[0] if args.stagger_ms else None)]
    for report in reports:
        lines += _probe_lines(report) + _profile_lines(report)
        if report.failures:
            lines += ["", f"Failed runs ({report.shape}):", *(f"- {f}" for f in report.failures)]
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.2f}"


def _dtype(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, dtype)


def _ratio_table(reports: list[ShapeReport], concurrencies: list[int]) -> list[str]:
    lines = [
        "tokens/s of (d) over each baseline, same run:",
        "",
        "| shape | concurrent | (d)/(a) | (d)/(b) | (d)/(c) |",
        "|---|---:|---:|---:|---:|",
    ]
    for report in reports:
        for concurrency in concurrencies:
            ratios = [report.ratio(concurrency, over) for over in ("a", "b", "c")]
            cells = " | ".join("—" if r is None else f"{r:.2f}x" for r in ratios)
            lines.append(f"| {report.shape} | {concurrency} | {cells} |")
    return lines


def _vllm_table(reports: list[ShapeReport], concurrencies: list[int]) -> list[str]:
    """Issue 19's comparison: tokenrelay with the vLLM engine (e) against `vllm serve` (f)
    and against tokenrelay's own engine (d), tokens/s ratios and TTFT p50 differences."""
    lines = [
        "The vLLM engine, same run: tokens/s ratios, and TTFT p50 of (e) minus (f):",
        "",
        "| shape | concurrent | (e)/(f) | (e)/(d) | TTFT p50 (e) - (f) ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for report in reports:
        for concurrency in concurrencies:
            ratios = [report.ratio(concurrency, over, "e") for over in ("f", "d")]
            cells = " | ".join("—" if r is None else f"{r:.2f}x" for r in ratios)
            ours, peer = report.cells.get(("e", concurrency)), report.cells.get(("f", concurrency))
            gap = f"{(ours.ttft_p50_s - peer.ttft_p50_s) * 1000:+.0f}" if ours and peer else "—"
            lines.append(f"| {report.shape} | {concurrency} | {cells} | {gap} |")
    return lines


def _lone_stream_lines(reports: list[ShapeReport]) -> list[str]:
    """Issue 18's lone-stream targets: (d) against `vllm serve` (f) at concurrency 1."""
    lines: list[str] = []
    for report in reports:
        ours, peer = report.cells.get(("d", 1)), report.cells.get(("f", 1))
        if ours is None or peer is None:
            continue
        speed = ours.tokens_per_s / peer.tokens_per_s
        ttft = ours.ttft_p50_s / peer.ttft_p50_s
        figures = f"(d) {ours.tokens_per_s:.1f} vs (f) {peer.tokens_per_s:.1f} tok/s"
        times = f"(d) {ours.ttft_p50_s:.2f} vs (f) {peer.ttft_p50_s:.2f} s"
        lines += [
            "",
            f"A lone stream, our engine (d) against `vllm serve` (f), {report.shape}, same run:",
            "",
            _verdict("decode ≥ 1.0x (f)", speed, speed >= 1.0, speed - 1, figures),
            _verdict("TTFT p50 ≤ 1.2x (f)", ttft, ttft <= 1.2, ttft / 1.2 - 1, times),
        ]
    return lines


def _stagger_table(reports: list[ShapeReport]) -> list[str]:
    lines = [
        "Staggered arrivals (a new request every interval; mid-batch = arrived while an "
        "earlier one was still streaming; lone = TTFT p50 of the same mode at concurrency 1):",
        "",
        "| shape | mode | requests | every ms | mid-batch | mid TTFT p50 s | mid TTFT p99 s "
        "| first TTFT s | lone TTFT s | mid p50 / lone | tok/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for report in reports:
        for s in report.staggers:
            lone = report.lone_ttft_s(s.mode)
            ratio = f"{s.mid_ttft_p50_s / lone:.2f}x" if lone and s.mid_batch else "—"
            lines.append(
                f"| {report.shape} | ({s.mode}) | {s.requests} | {s.interval_ms:.0f} | "
                f"{s.mid_batch} | {_seconds(s.mid_ttft_p50_s)} | {_seconds(s.mid_ttft_p99_s)} | "
                f"{s.first_ttft_s:.2f} | {_seconds(lone)} | {ratio} | {s.tokens_per_s:.1f} |"
            )
    for report in reports:
        for s in report.staggers:
            if s.phases:
                phases = ", ".join(f"{name} {sec:.2f} s" for name, sec in s.phases.items())
                lines += [
                    "",
                    f"{report.shape} ({s.mode}) every {s.interval_ms:.0f} ms, mid-batch TTFT "
                    f"split by the job's Redis timestamps (medians): {phases}.",
                ]
    return lines


def _targets(reports: list[ShapeReport], stagger_ms: float | None) -> list[str]:
    report = next((r for r in reports if r.shape == TARGET_SHAPE), None)
    if report is None:
        return [f"Targets (issue 3) are set on {TARGET_SHAPE}, which this run skipped."]
    lines = [f"Targets (issue 3, {TARGET_SHAPE}, {_dtype(report.dtype)}):", ""]
    for concurrency, over, bound in ((8, "b", 3.5), (8, "c", 1.0), (32, "c", 1.0)):
        ratio = report.ratio(concurrency, over)
        name = f"(d) ≥ {bound}x ({over}) at {concurrency} concurrent"
        if ratio is None:
            lines.append(f"- {name}: not measured")
            continue
        ours, base = report.cells[("d", concurrency)], report.cells[(over, concurrency)]
        figures = f"(d) {ours.tokens_per_s:.1f} vs ({over}) {base.tokens_per_s:.1f} tok/s"
        lines.append(_verdict(name, ratio, ratio >= bound, ratio / bound - 1, figures))
    stagger = next(
        (s for s in report.staggers if s.mode == "d" and s.interval_ms == stagger_ms), None
    )
    lone = report.lone_ttft_s()
    if stagger and lone and stagger.mid_batch:
        ratio = stagger.mid_ttft_p50_s / lone
        figures = f"mid-batch {stagger.mid_ttft_p50_s:.2f} s vs lone {lone:.2f} s"
        name = f"TTFT p50 mid-batch (every {stagger.interval_ms:.0f} ms) ≤ 2x lone"
        lines.append(_verdict(name, ratio, ratio <= 2.0, ratio / 2 - 1, figures))
    return lines


def _verdict(name: str, ratio: float, met: bool, gap: float, figures: str) -> str:
    outcome = "MET" if met else f"MISSED by {abs(gap):.0%}"
    return f"- {name}: {ratio:.2f}x → {outcome} ({figures})"


def _revision() -> str:
    """The repository's commit, and whether the code under test had local changes."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "worker", "shared", "api")
    return f"commit {commit}" + (" with local changes in worker/, shared/ or api/" if dirty else "")


def _probe_lines(report: ShapeReport) -> list[str]:
    lines = [""] + [f"{report.shape}: {line}" for line in report.setup]
    if report.probe is None:
        return lines
    rates = ", ".join(f"{_dtype(d)} {r:.1f}" for d, r in report.probe.tokens_per_s.items())
    return [
        *lines,
        "",
        f"dtype probe ({report.shape}, the worker's engine in-process, 8 requests x 32 tokens, "
        f"tok/s): {rates} → {_dtype(report.probe.fastest)} for every mode.",
    ]


def _profile_lines(report: ShapeReport) -> list[str]:
    lines: list[str] = []
    for label, profile in report.profiles.items():
        if not profile.samples:
            continue
        parts = ", ".join(f"{name} {share:.0%}" for name, share in profile.parts)
        leaves = ", ".join(f"{name} {share:.0%}" for name, share in profile.leaves)
        lines += [
            "",
            f"Worker profile ({report.shape}, (d) {label}, py-spy --idle on the batcher thread, "
            f"{profile.samples} samples): {parts}.",
            "",
            f"Innermost frames there: {leaves}.",
        ]
    if report.process_cpu:
        lines.append("")
    for usage in report.process_cpu:
        cpu = ", ".join(
            f"{role} {seconds:.1f} s ({seconds / usage.wall_s:.0%})"
            for role, seconds in usage.cpu_s.items()
        )
        lines.append(
            f"- CPU during one ({usage.mode}) x{usage.concurrency} run of {usage.wall_s:.1f} s: "
            f"{cpu} (100% = one core)."
        )
    return lines
