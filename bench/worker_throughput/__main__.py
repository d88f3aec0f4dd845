"""Worker throughput: tokenrelay end to end against three single-process baselines.

For each model shape, N concurrent requests x `--new-tokens` tokens (EOS suppressed, so all
lengths are equal) through
  (a) sequential `model.generate`, one request after another;
  (b) the first article's approach: a thread per request calling `model.generate` with a
      `TextIteratorStreamer`;
  (c) `transformers serve --continuous-batching` (explicit `--cb-*` flags), over HTTP;
  (d) tokenrelay: HTTP → admission → RQ → one worker → SSE, through a real Redis;
then a staggered-arrival run (a new request every `--stagger-ms`) on each server mode, and a
py-spy profile of the worker's step loop. The runs of all modes are interleaved, so load
from other processes on the machine spreads over all of them.

    python -m bench.worker_throughput            # both shapes (most of an hour on 2 cores)
    python -m bench.worker_throughput --quick    # tiny model only (a few minutes)

Progress goes to stderr, the tables (markdown) to stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import ensure_model, log, make_conversations
from bench.worker_throughput.client import run_http
from bench.worker_throughput.dtype_probe import probe_dtype
from bench.worker_throughput.inprocess import (
    LocalModel,
    run_sequential,
    run_threaded,
    sampling_defaults,
)
from bench.worker_throughput.limits import measure_limits
from bench.worker_throughput.profile import py_spy, record_during, summarize
from bench.worker_throughput.report import (
    DEFAULT_MODES,
    MODES,
    TARGET_SHAPE,
    ProcessCpu,
    ShapeReport,
    Stagger,
    render,
)
from bench.worker_throughput.servers import (
    CbFlags,
    StreamingServer,
    TokenrelayStack,
    TransformersServe,
    VllmServe,
)
from bench.worker_throughput.stats import CellSummary, RunResult, process_ticks, wait_for_quiet

SHAPES = ("tiny", "tiny-h32", "qwen2-0.5b")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")

Chats = list[list[dict]]


@dataclass(frozen=True)
class Mode:
    """One way of serving: `run(chats, new_tokens)` runs the chats, all due at once;
    `server` is set for (c) and (d)."""

    key: str
    run: Callable[[Chats, int], RunResult]
    server: StreamingServer | None = None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    shapes = ["tiny"] if args.quick else args.shapes
    unknown = (set(shapes) - set(SHAPES)) | (set(args.modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown shapes or modes: {sorted(unknown)}")
    started = time.monotonic()
    reports = []
    for shape in shapes:
        with ExitStack() as stack:
            reports.append(ShapeBench(shape, args, stack).run())
        gc.collect()
    log(f"done in {time.monotonic() - started:.0f} s")
    print(render(reports, args))
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in reports], indent=2) + "\n")
    return 0


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _csv_int(text: str) -> list[int]:
    return [int(part) for part in _csv(text)]


def _csv_float(text: str) -> list[float]:
    return [float(part) for part in _csv(text)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.worker_throughput", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="tiny model only (no profile)")
    add(
        "--shapes",
        type=_csv,
        default=["tiny", "qwen2-0.5b"],
        help="default: tiny,qwen2-0.5b; also tiny-h32",
    )
    add(
        "--modes",
        type=_csv,
        default=list(DEFAULT_MODES),
        help="default: a,b,c,d; e and f (vLLM) need --vllm-python and a head size >= 32",
    )
    add(
        "--device",
        default="cpu",
        help="the tokenrelay workers' TOKENRELAY_DEVICE, for (d) and (e); `vllm serve` picks "
        "its own (bench/gpu.sh passes cuda)",
    )
    add(
        "--vllm-python",
        type=Path,
        default=Path(".venv-vllm/bin/python"),
        help="the vLLM environment's interpreter, for modes (e) and (f)",
    )
    add("--concurrency", type=_csv_int, default=[1, 8, 32], help="default: 1,8,32")
    add("--new-tokens", type=int, default=64)
    add("--prompt-tokens", type=int, default=128, help="per request, chat template included")
    add("--repeats", type=int, default=3, help="runs per cell; the table shows medians")
    add(
        "--heavy-repeats",
        type=int,
        default=1,
        help=f"runs per cell on {TARGET_SHAPE} at concurrency >= 32 (minutes each)",
    )
    add(
        "--quiet-share",
        type=float,
        default=0.25,
        help="before each run, wait for 2 s in which other processes use less than this "
        "share of the CPU (the machine is shared) ...",
    )
    add("--quiet-wait-s", type=float, default=120.0, help="... but no longer than this")
    add(
        "--max-others",
        type=float,
        default=0.3,
        help="run a cell again (fresh prompts) when other processes used more than this "
        "share of the CPU during it ...",
    )
    add("--retries", type=int, default=2, help="... at most this many times; keep the quietest")
    add("--stagger-requests", type=int, default=16, help="0 skips the staggered run")
    add(
        "--stagger-ms",
        type=_csv_float,
        default=[200.0, 1000.0],
        help="arrival intervals, default 200,1000; the first is issue 3's target",
    )
    add(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help=f"{TARGET_SHAPE}'s dtype in every mode; auto times the worker's engine in both "
        "and takes the faster (tiny always runs float32)",
    )
    add("--cb-block-size", type=int, default=32, help="(c) KV page size, tokens")
    add("--cb-num-blocks", type=int, default=0, help="(c) KV pages; 0 sizes them to the run")
    add("--cb-max-batch-tokens", type=int, default=2048, help="(c) tokens per forward pass")
    add(
        "--profile-concurrency",
        type=_csv_int,
        default=[8, 32],
        help=f"on {TARGET_SHAPE}, one extra (c) and (d) run at each, with py-spy on the "
        "worker; empty skips",
    )
    add("--cache-dir", type=Path, default=Path(".cache/bench"), help="models and logs")
    add("--json", type=Path, help="also write the figures to this file")
    return parser


class ShapeBench:
    """Every run on one model shape; servers stop when `stack` closes."""

    def __init__(self, shape: str, args: argparse.Namespace, stack: ExitStack) -> None:
        from transformers import AutoTokenizer

        self.shape = shape
        self.args = args
        self.stack = stack
        self.model_dir = ensure_model(args.cache_dir.resolve(), shape)
        self.log_dir = args.cache_dir.resolve() / "logs" / shape
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.model_dir)
        self.report = ShapeReport(shape, dtype="float32")

    def run(self) -> ShapeReport:
        self.report.dtype = self._pick_dtype()
        modes = self._start_modes()
        for mode in modes:
            log(f"{self.shape}: warming up ({mode.key})")
            mode.run(self._chats(min(8, max(self.args.concurrency)), f"warm-{mode.key}"), 8)
        self._run_cells(modes)
        if self.shape == TARGET_SHAPE:
            self._wait_for_quiet()
            self.report.limits = measure_limits(self.report.dtype)
        servers = {mode.key: mode.server for mode in modes if mode.server is not None}
        self._run_staggered(servers)
        self._run_profiles(servers)
        return self.report

    def _chats(self, n: int, tag: str) -> Chats:
        return make_conversations(n, self.args.prompt_tokens, tag, self.tokenizer)

    def _wait_for_quiet(self) -> None:
        waited = wait_for_quiet(self.args.quiet_share, self.args.quiet_wait_s)
        if waited > 5:
            log(f"waited {waited:.0f} s for other processes to leave the CPU")

    def _measure(self, label: str, run: Callable[[int], RunResult]) -> RunResult | None:
        """`run(attempt)` after a quiet moment; again (up to `--retries` times) while other
        processes took more than `--max-others` of the CPU during it, or it failed. The
        quietest attempt counts; None if every attempt failed (noted in the report)."""
        best: RunResult | None = None
        for attempt in range(1 + self.args.retries):
            self._wait_for_quiet()
            try:
                result = run(attempt)
            except Exception as exc:
                log(f"{label} failed: {type(exc).__name__}: {exc}")
                self.report.failures.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            self.report.loads.append(os.getloadavg()[0])
            if best is None or result.foreign_cpu < best.foreign_cpu:
                best = result
            if result.foreign_cpu <= self.args.max_others:
                break
            log(f"others used {result.foreign_cpu:.0%} of the CPU meanwhile")
        return best

    def _pick_dtype(self) -> str:
        if self.shape == "tiny" or self.args.dtype != "auto":
            return "float32" if self.shape == "tiny" else str(self.args.dtype)
        log(f"{self.shape}: timing the worker's engine in float32 and bfloat16")
        self.report.probe = probe_dtype(
            self.model_dir,
            self.args.prompt_tokens,
            requests=8,
            new_tokens=32,
            repeats=2,
            before_each=self._wait_for_quiet,
        )
        gc.collect()
        return self.report.probe.fastest

    def _start_modes(self) -> list[Mode]:
        args, dtype = self.args, self.report.dtype
        peak = max([*args.concurrency, args.stagger_requests, *args.profile_concurrency])
        modes: list[Mode] = []
        local = LocalModel(self.model_dir, dtype) if {"a", "b"} & set(args.modes) else None
        if local is not None and "a" in args.modes:
            modes.append(Mode("a", partial(run_sequential, local)))
        if local is not None and "b" in args.modes:
            modes.append(Mode("b", partial(run_threaded, local)))
        if "c" in args.modes:
            page = args.cb_block_size
            per_request = args.prompt_tokens + args.new_tokens + 2 * page
            pages = args.cb_num_blocks or math.ceil(1.25 * peak * per_request / page)
            cb = CbFlags(page, pages, args.cb_max_batch_tokens)
            sampling = local.sampling if local else sampling_defaults(self.model_dir)
            serve = TransformersServe(self.model_dir, dtype, cb, sampling, self.log_dir)
            self.stack.callback(serve.stop)
            log(f"{self.shape}: transformers serve is up ({' '.join(cb.args())})")
            self.report.setup.append(
                f"(c) `transformers serve --continuous-batching {' '.join(cb.args())} "
                f"--device cpu --dtype {dtype}`; EOS off through a per-request "
                "`generation_config` with `eos_token_id: -1`."
            )
            modes.append(Mode("c", partial(run_http, serve), serve))
        if "d" in args.modes:
            tokenrelay = TokenrelayStack(
                self.model_dir, dtype, peak, self.log_dir, device=args.device
            )
            self.stack.callback(tokenrelay.stop)
            log(f"{self.shape}: tokenrelay api + worker are up (WORKER_CONCURRENCY={peak})")
            self.report.setup.append(
                f"(d) one `tokenrelay api` (1 uvicorn process), one `tokenrelay worker` with "
                f"TOKENRELAY_WORKER_CONCURRENCY={peak}, TOKENRELAY_MAX_INFLIGHT="
                f"{tokenrelay.max_inflight}, TOKENRELAY_DTYPE={dtype}, other settings at their "
                "defaults; requests send `min_tokens` = `max_tokens`."
            )
            modes.append(Mode("d", partial(run_http, tokenrelay), tokenrelay))
        modes += self._start_vllm_modes(peak)
        return modes

    def _start_vllm_modes(self, peak: int) -> list[Mode]:
        """(e) tokenrelay with the vLLM engine and (f) `vllm serve`, from the vLLM environment."""
        args, dtype = self.args, self.report.dtype
        python = str(args.vllm_python.absolute())  # not resolve(): the venv is the link
        modes: list[Mode] = []
        if "e" in args.modes:
            stack = TokenrelayStack(
                self.model_dir, dtype, peak, self.log_dir, vllm_python=python, device=args.device
            )
            self.stack.callback(stack.stop)
            log(f"{self.shape}: tokenrelay api + vLLM-engine worker are up")
            self.report.setup.append(
                f"(e) as (d), the worker with TOKENRELAY_ENGINE=vllm from {args.vllm_python} "
                "(vLLM's CPU threads bound to both cores)."
            )
            modes.append(Mode("e", partial(run_http, stack), stack))
        if "f" in args.modes:
            defaults = sampling_defaults(self.model_dir)
            sampling = {name: defaults[name] for name in ("temperature", "top_p", "top_k")}
            serve = VllmServe(python, self.model_dir, dtype, peak, sampling, self.log_dir)
            self.stack.callback(serve.stop)
            log(f"{self.shape}: vllm serve is up")
            self.report.setup.append(
                f"(f) `python -m vllm.entrypoints.openai.api_server --max-num-seqs {peak} "
                f"--dtype {dtype} --generation-config vllm --max-model-len 4096`, requests with "
                f"{sampling} and "
                "`min_tokens` = `max_tokens`."
            )
            modes.append(Mode("f", partial(run_http, serve), serve))
        return modes

    def _run_cells(self, modes: list[Mode]) -> None:
        for concurrency in self.args.concurrency:
            runs: dict[str, list[RunResult]] = {mode.key: [] for mode in modes}
            heavy = self.shape == TARGET_SHAPE and concurrency >= 32
            repeats = self.args.heavy_repeats if heavy else self.args.repeats
            for repeat in range(repeats):
                for mode in modes:
                    tag = f"{self.shape}-{mode.key}-{concurrency}-{repeat}"
                    label = f"{self.shape} ({mode.key}) x{concurrency}"
                    result = self._measure(label, partial(self._run_mode, mode, concurrency, tag))
                    if result is None:
                        continue
                    runs[mode.key].append(result)
                    log(
                        f"{self.shape} ({mode.key}) x{concurrency} run {repeat + 1}/{repeats}: "
                        f"{result.tokens_per_s:.1f} tok/s, TTFT min {result.ttft(0):.2f} s "
                        f"p50 {result.ttft(0.5):.2f} s p99 {result.ttft(0.99):.2f} s; "
                        f"others used {result.foreign_cpu:.0%} CPU"
                    )
            for key, mode_runs in runs.items():
                if mode_runs:
                    self.report.cells[(key, concurrency)] = CellSummary.of(
                        mode_runs, self.args.new_tokens
                    )

    def _run_mode(self, mode: Mode, concurrency: int, tag: str, attempt: int) -> RunResult:
        return mode.run(self._chats(concurrency, f"{tag}-{attempt}"), self.args.new_tokens)

    def _run_staggered(self, servers: dict[str, StreamingServer]) -> None:
        """Each server mode run ((d), (e), (c), (f)), at each `--stagger-ms`: a new request
        every interval; each tokenrelay job's Redis timestamps split its TTFT into phases."""
        if self.args.stagger_requests <= 0:
            return
        for interval_ms in self.args.stagger_ms:
            for key in ("d", "e", "c", "f"):
                if key not in servers:
                    continue
                server = servers[key]
                label = f"{self.shape} ({key}) every {interval_ms:.0f} ms"
                tag = f"stagger-{key}-{interval_ms:.0f}"
                run = self._measure(label, partial(self._stagger_run, server, tag, interval_ms))
                if run is None:
                    continue
                phases = _phases(server, run) if isinstance(server, TokenrelayStack) else {}
                stagger = Stagger.of(key, run, interval_ms, phases)
                self.report.staggers.append(stagger)
                log(
                    f"{label}: mid-batch TTFT p50 {stagger.mid_ttft_p50_s:.2f} s "
                    f"({stagger.mid_batch}/{stagger.requests} mid-batch), "
                    f"first {stagger.first_ttft_s:.2f} s"
                )

    def _stagger_run(
        self, server: StreamingServer, tag: str, interval_ms: float, attempt: int
    ) -> RunResult:
        chats = self._chats(self.args.stagger_requests, f"{tag}-{attempt}")
        return run_http(server, chats, self.args.new_tokens, interval_ms / 1000)

    def _run_profiles(self, servers: dict[str, StreamingServer]) -> None:
        """Extra runs on the target shape, outside the table: py-spy on the worker during a
        staggered run and during (d) at each `--profile-concurrency`, and the CPU seconds of
        each server process during (c) and (d) at those concurrencies."""
        tokenrelay = servers.get("d")
        if self.shape != TARGET_SHAPE or self.args.quick or tokenrelay is None:
            return
        if py_spy() is None:
            log("py-spy is not installed (pip install py-spy): no worker profile")
            return
        worker_pid = tokenrelay.pids()["tokenrelay worker"]
        runs: list[tuple[str, StreamingServer, Callable[[], RunResult], int]] = []
        if self.args.stagger_requests > 0 and self.args.stagger_ms:
            interval_ms = self.args.stagger_ms[0]
            stagger = partial(self._stagger_run, tokenrelay, "profile-stagger", interval_ms, 0)
            runs.append((f"staggered every {interval_ms:.0f} ms", tokenrelay, stagger, 0))
        for concurrency in self.args.profile_concurrency:
            for key in ("c", "d"):
                if key in servers:
                    mode = Mode(key, partial(run_http, servers[key]), servers[key])
                    burst = partial(self._run_mode, mode, concurrency, f"profile-{key}", 0)
                    runs.append((f"x{concurrency}", servers[key], burst, concurrency))
        for label, server, measure, concurrency in runs:
            self._wait_for_quiet()
            before = {role: process_ticks(pid) for role, pid in server.pids().items()}
            try:
                if server is tokenrelay:
                    raw = self.log_dir / f"worker-pyspy-{label.replace(' ', '-')}.txt"
                    log(f"{self.shape}: py-spy on the worker during a {label} run, into {raw}")
                    run = record_during(worker_pid, raw, measure)
                    self.report.profiles[label] = summarize(raw)
                else:
                    log(f"{self.shape}: CPU of transformers serve during a {label} run")
                    run = measure()
            except Exception as exc:
                log(f"profile run {label} failed: {type(exc).__name__}: {exc}")
                self.report.failures.append(f"profile {label}: {type(exc).__name__}: {exc}")
                continue
            if concurrency:
                cpu = {
                    role: (process_ticks(pid) - before[role]) / _TICKS_PER_S
                    for role, pid in server.pids().items()
                }
                mode_key = "d" if server is tokenrelay else "c"
                self.report.process_cpu.append(ProcessCpu(mode_key, concurrency, run.wall_s, cpu))


def _phases(server: TokenrelayStack, run: RunResult) -> dict[str, float]:
    """Medians over the mid-batch requests: client send → admitted (`created_at`), admitted →
    a worker started it (`started_at`: RQ queue and dequeue), worker start → first text at
    the client (waiting for the step in progress, its own prefill, emit, SSE)."""
    admit, queue, first = [], [], []
    for timing in Stagger.arrivals_mid_batch(run):
        created_at, started_at = server.job_times(timing.request_id)
        if started_at is None:
            continue
        sent_at = run.started_at + timing.due_s
        admit.append(created_at - sent_at)
        queue.append(float(started_at) - created_at)
        first.append(run.started_at + timing.first_token_s - float(started_at))
    if not admit:
        return {}
    return {
        "send → admitted": statistics.median(admit),
        "admitted → worker started": statistics.median(queue),
        "worker started → first text at client": statistics.median(first),
    }


if __name__ == "__main__":
    sys.exit(main())
