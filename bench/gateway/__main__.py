"""Gateway overhead benchmark: what tokenrelay adds on top of the engine, per stream and per token.

Starts Redis, N API processes and M workers on the synthetic engine, then for each number of
concurrent streams runs closed-loop clients (each one stream after another over a keep-alive
connection, starts spread evenly over one stream length) and measures, inside a window that
opens once every client is in its second stream:

- time to first token minus the engine's own first-token delay (HTTP, admission, enqueue,
  worker pickup, first event, pub/sub, SSE), split into phases with the job's Redis timestamps;
- inter-token arrival at the client minus the engine's 1/rate per token;
- tokens forwarded per second per API process and the CPU it used (and the workers', the
  client's and Redis's, from /proc and `INFO cpu`);
- Redis commands per generated token (`INFO commandstats`, Lua-internal calls included);
- Redis connections per API process and per worker (`CLIENT LIST` matched to each pid).

`--relay-only` replaces the workers by a lockstep publisher (`bench/gateway/relay.py`) to
measure API processes and Redis alone. `--api chat,messages,responses` runs each level once
per API on the same cluster (chat completions, Anthropic's messages, OpenAI's Responses) and
adds a table of each API against chat completions. Results and their reading:
docs/benchmarks/gateway.md.

    .venv/bin/python -m bench.gateway                                  # 1, 64, 512, 2000 streams
    .venv/bin/python -m bench.gateway --rate 200 --flush-ms 0,50 --concurrency 1,16,64
    .venv/bin/python -m bench.gateway --relay-only --concurrency 64,256,512,1000
    .venv/bin/python -m bench.gateway --api chat,messages,responses,chat --concurrency 64

Progress goes to stderr, the tables (markdown) to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis.asyncio
import uvloop

from bench.common import log
from bench.gateway.client import (
    APIS,
    JOB_EVENTS,
    LoadGenerator,
    LoadStats,
    RequestFactory,
    SseDialect,
    StreamSample,
    Window,
    job_events_request,
)
from bench.gateway.cluster import (
    MODEL_NAME,
    BenchCluster,
    ClusterSpec,
    Delta,
    pubsub_output_bytes,
    redis_clients_by_pid,
    snapshot,
)
from bench.gateway.relay import LockstepPublisher
from bench.gateway.report import (
    LevelPlan,
    LevelResult,
    api_table,
    figures,
    main_table,
    phase_table,
    redis_table,
    redis_time_table,
    write_json,
)
from tokenrelay.shared.jobs import JobField
from tokenrelay.shared.redis import keys
from tokenrelay.shared.settings import Settings

_START_DELAY_S = 0.5
_SETTLE_S = 1.0
_PROGRESS_EVERY_S = 2.0
_DRAIN_MARGIN_S = 30.0


@dataclass(frozen=True)
class Options:
    concurrency: list[int]
    duration_s: float
    rates: list[float]
    flush_ms: list[float]
    api_processes: int
    workers: int
    first_token_ms: float
    min_stream_s: float
    max_start_rate: float
    relay_only: bool
    apis: list[str]
    batch_jobs: int
    profile_dir: Path | None
    json_path: Path | None


def _parse_list(text: str, kind: type[int] | type[float]) -> list[float]:
    return [kind(part) for part in text.split(",") if part.strip()]


async def _profile(pids: dict[str, int], seconds: float, out_dir: Path, tag: str) -> None:
    """py-spy (collapsed stacks, non-blocking) on each process for `seconds`."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        log("--profile-dir given but py-spy is not on PATH; skipping profiles")
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [
        await asyncio.create_subprocess_exec(
            py_spy,
            "record",
            "--nonblocking",
            "--format",
            "raw",
            "--rate",
            "100",
            "--duration",
            str(max(1, int(seconds))),
            "--pid",
            str(pid),
            "--output",
            str(out_dir / f"{name}-{tag}.txt"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    await asyncio.gather(*(run.wait() for run in runs))


async def _progress(stats: LoadStats, plan: LevelPlan, window: Window, tag: str) -> None:
    last_tokens, last_at = 0, time.perf_counter()
    while True:
        await asyncio.sleep(_PROGRESS_EVERY_S)
        now = time.perf_counter()
        rate = (stats.tokens_total - last_tokens) / (now - last_at)
        last_tokens, last_at = stats.tokens_total, now
        phase = "ramp" if now < window.start else "window" if now < window.end else "drain"
        log(
            f"{tag} {phase}: {stats.active} active, {stats.streams_completed} done, "
            f"{rate:,.0f} tok/s, {sum(stats.errors.values())} errors"
        )


async def _phases(
    client: redis.asyncio.Redis, samples: list[StreamSample]
) -> dict[str, list[float]]:
    """Time to first token split at the job's `created_at` (admitted) and `started_at`."""
    phases: dict[str, list[float]] = {"to_admitted": [], "to_started": [], "to_first_token": []}
    for offset in range(0, len(samples), 500):
        batch = samples[offset : offset + 500]
        async with client.pipeline(transaction=False) as pipe:
            for sample in batch:
                pipe.hmget(keys.job(sample.job_id), JobField.CREATED_AT, JobField.STARTED_AT)
            replies = await pipe.execute()
        for sample, (created, started) in zip(batch, replies, strict=True):
            if created is None or started is None:
                continue
            phases["to_admitted"].append(1000 * (float(created) - sample.sent_wall_s))
            phases["to_started"].append(1000 * (float(started) - float(created)))
            phases["to_first_token"].append(1000 * (sample.first_token_wall_s - float(started)))
    return phases


async def run_level(
    cluster: BenchCluster, plan: LevelPlan, options: Options, flush_ms: float, api: str
) -> LevelResult:
    mode = "relay-only" if options.relay_only else api
    tag = f"[{mode}, {plan.tokens_per_s:g} tok/s, flush {flush_ms:g} ms, {plan.streams} streams]"
    client = redis.asyncio.Redis.from_url(cluster.redis_url, decode_responses=True)
    me = psutil.Process()
    processes = [*cluster.api, *cluster.workers, me]
    t0 = time.perf_counter() + _START_DELAY_S
    window = Window(
        t0 + plan.stream_s + _SETTLE_S, t0 + plan.stream_s + _SETTLE_S + plan.duration_s
    )
    stats = LoadStats(api_count=len(cluster.api_ports))
    requests: RequestFactory
    dialect: SseDialect
    publishing: asyncio.Task[None] | None = None
    if options.relay_only:
        settings = cluster.spec.settings(cluster.redis_url)
        interval_s = 1 / plan.tokens_per_s
        publisher = LockstepPublisher(
            client, settings, plan.max_tokens, interval_s, options.batch_jobs
        )
        ports = cluster.api_ports

        async def requests(api_index: int) -> bytes:
            return job_events_request(await publisher.new_job(), ports[api_index])

        dialect = JOB_EVENTS
        publishing = asyncio.create_task(publisher.run())
    else:
        path, dialect, make_requests = APIS[api]
        requests = make_requests(path, MODEL_NAME, plan.max_tokens, cluster.api_ports)
    generator = LoadGenerator(
        cluster.api_ports, requests, dialect, 1 / plan.tokens_per_s, window, stats
    )
    log(f"{tag} {plan.max_tokens} tokens per stream, window {plan.duration_s:g}s after ramp")
    clients = [
        asyncio.create_task(generator.client(i, t0 + i * plan.stream_s / plan.streams, window.end))
        for i in range(plan.streams)
    ]
    progress = asyncio.create_task(_progress(stats, plan, window, tag))
    await asyncio.sleep(window.start - time.perf_counter())
    load_1m = os.getloadavg()[0]
    before = await snapshot(client, processes)
    profiling = None
    if options.profile_dir is not None:
        pids = {f"api{i}": p.pid for i, p in enumerate(cluster.api)}
        pids |= {f"worker{i}": p.pid for i, p in enumerate(cluster.workers)}
        suffix = f"{plan.tokens_per_s:g}tps-{flush_ms:g}ms-{plan.streams}"
        profiling = asyncio.create_task(
            _profile(pids, plan.duration_s, options.profile_dir, suffix)
        )
    omem_max = conns_max = 0
    while time.perf_counter() < window.end - 1.0:
        await asyncio.sleep(1.0)
        listing = await client.client_list()
        omem_max = max(omem_max, pubsub_output_bytes(listing))
        conns_max = max(conns_max, len(listing))
    await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
    after = await snapshot(client, processes)
    delta = Delta.between(before, after)
    listing = await client.client_list()
    by_pid = await asyncio.to_thread(
        redis_clients_by_pid, listing, cluster.redis_port, [*cluster.api, *cluster.workers]
    )
    _, pending = await asyncio.wait(clients, timeout=plan.stream_s * 2 + _DRAIN_MARGIN_S)
    for task in pending:
        task.cancel()
    progress.cancel()
    if publishing is not None:
        publishing.cancel()
        log(f"{tag} publisher: {publisher.late_steps} of {publisher.steps} steps started late")
    if profiling is not None:
        await profiling
    result = LevelResult(
        mode="relay" if options.relay_only else api,
        plan=plan,
        flush_ms=flush_ms,
        first_token_ms=options.first_token_ms,
        load_1m=load_1m,
        stats=stats,
        delta=delta,
        api_cpu_s=[delta.cpu_s[p.pid] for p in cluster.api],
        worker_cpu_s=[delta.cpu_s[p.pid] for p in cluster.workers],
        client_cpu_s=delta.cpu_s[me.pid],
        conns_per_api=[by_pid[p.pid] for p in cluster.api],
        conns_per_worker=[by_pid[p.pid] for p in cluster.workers],
        conns_total_max=max(conns_max, len(listing)),
        pubsub_omem_max=omem_max,
        phases_ms=await _phases(client, stats.samples),
    )
    await client.aclose()
    tokens = sum(stats.tokens_by_api)
    log(f"{tag} done: {tokens:,} tokens in window, errors {dict(stats.errors)}")
    return result


def plan_for(streams: int, rate: float, options: Options) -> LevelPlan:
    """Streams are long enough that no more than `max_start_rate` start per second."""
    stream_s = max(options.min_stream_s, streams / options.max_start_rate)
    return LevelPlan(streams, rate, stream_s, options.duration_s)


async def run(options: Options) -> list[LevelResult]:
    results: list[LevelResult] = []
    for rate in options.rates:
        for flush_ms in options.flush_ms:
            spec = ClusterSpec(
                api_processes=options.api_processes,
                workers=0 if options.relay_only else options.workers,
                tokens_per_s=rate,
                first_token_ms=options.first_token_ms,
                flush_interval_ms=flush_ms,
                worker_concurrency=max(options.concurrency) // options.workers + 64,
                streams=max(options.concurrency),
            )
            log(f"starting Redis, {spec.api_processes} API, {spec.workers} worker(s): {spec}")
            with BenchCluster(spec) as cluster:
                log(f"logs in {cluster.log_dir}")
                for streams in options.concurrency:
                    plan = plan_for(streams, rate, options)
                    for api in ["chat"] if options.relay_only else options.apis:
                        results.append(await run_level(cluster, plan, options, flush_ms, api))
    return results


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--concurrency", default="1,64,512,2000", help="streams per level")
    parser.add_argument("--duration", type=float, default=10.0, help="measurement window, s")
    parser.add_argument("--rate", default="20", help="engine tokens/s per stream (list)")
    parser.add_argument("--flush-ms", default="0", help="TOKENRELAY_FLUSH_INTERVAL_MS (list)")
    parser.add_argument("--api-processes", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--first-token-ms", type=float, default=0.0, help="engine's own TTFT")
    parser.add_argument("--min-stream-s", type=float, default=2.0, help="shortest stream, s")
    parser.add_argument(
        "--max-start-rate",
        type=float,
        default=200.0,
        help="streams get longer so that at most this many start per second",
    )
    parser.add_argument(
        "--relay-only",
        action="store_true",
        help="no worker: a lockstep publisher emits every job's token each step "
        "(bench/gateway/relay.py), clients read GET /v1/jobs/{id}/events",
    )
    parser.add_argument(
        "--api",
        default="chat",
        help=f"the generation APIs to stream, each level once per API (of {', '.join(APIS)})",
    )
    parser.add_argument(
        "--batch-jobs", type=int, default=256, help="relay-only: jobs per EMIT call"
    )
    parser.add_argument("--profile-dir", type=Path, help="py-spy each process in the window")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    apis = [api.strip() for api in args.api.split(",") if api.strip()]
    if unknown := [api for api in apis if api not in APIS]:
        parser.error(f"--api: unknown {unknown}; choose from {list(APIS)}")
    return Options(
        concurrency=[int(c) for c in _parse_list(args.concurrency, int)],
        duration_s=args.duration,
        rates=_parse_list(args.rate, float),
        flush_ms=_parse_list(args.flush_ms, float),
        api_processes=args.api_processes,
        workers=args.workers,
        first_token_ms=args.first_token_ms,
        min_stream_s=args.min_stream_s,
        max_start_rate=args.max_start_rate,
        relay_only=args.relay_only,
        apis=apis,
        batch_jobs=args.batch_jobs,
        profile_dir=args.profile_dir,
        json_path=args.json,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    log(f"machine: {psutil.cpu_count()} CPUs, load {os.getloadavg()}")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = runner.run(run(options))
    rows = [figures(result) for result in results]
    if options.relay_only:
        producer = f"no worker: lockstep publisher, {options.batch_jobs} jobs per EMIT call"
    else:
        steps = "in lockstep" if Settings().synthetic_lockstep else "each job on its own phase"
        producer = (
            f"{options.workers} synthetic worker(s) decoding {steps}, engine first-token delay "
            f"{options.first_token_ms:g} ms"
        )
    setup = f"{options.api_processes} API process(es), {producer}, {psutil.cpu_count()} CPUs"
    print(setup, end="\n\n")
    print(main_table(rows), end="\n\n")
    print(phase_table(rows), end="\n\n")
    print(redis_table(rows), end="\n\n")
    print(redis_time_table(rows))
    if len({row["mode"] for row in rows}) > 1:
        print("", api_table(rows), sep="\n")
    if options.json_path is not None:
        write_json(options.json_path, {"setup": setup}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
