"""Redis CPU per token per shard with the token plane on a Redis Cluster of one primary, then
of two (issue 16 item 6).

For each size: a fresh `tokenrelay.testing.cluster`; `--jobs` running jobs whose logs
OPEN starts, picked so that each primary owns as many (random ids split so on average; the
bench removes the ±√n spread, which would charge the busiest shard for luck); `--drivers`
processes that send their jobs' token events the way a worker on a cluster does
(`worker.delivery.Courier`: one EMIT per job per step, SPUBLISH); one sharded subscriber per
primary reading every channel, as an API's stream hub does. Prints, per shard, its jobs,
its commands and Redis main-thread CPU per token of the whole run (its share / all tokens:
what halves when a second shard takes half the jobs) and how busy its main thread was, and the token
rate the cluster would sustain with its busiest shard at 100 % (all tokens/s ÷ that
shard's busy share). The drivers, not Redis, bound the rate a 2-core box offers, so the
sustained rate is this extrapolation, not a measured saturation; the one-primary run is
the same-run peer of the ratio.

    .venv/bin/python -m bench.probes.redis_shards [--seconds 5] [--jobs 64] [--drivers 2]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import dataclass

import redis
import redis.cluster

from bench.common import drain
from tokenrelay.shared.events import Started, TokenChunk
from tokenrelay.shared.redis import keys, plane_scripts
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.testing.cluster import EmbeddedCluster, embedded_cluster

_EVENT = TokenChunk(text="lorem ", tokens=1).to_wire()


def _settings(url: str) -> Settings:
    return Settings(stream_redis_url=url, stream_redis_cluster=True)


def _drive(url: str, job_ids: list[str], seconds: float, sent: multiprocessing.Queue) -> None:
    """One driver process: EMIT one event per job per step until `seconds` ran out."""
    settings = _settings(url)
    with redis.cluster.RedisCluster.from_url(url, decode_responses=True) as client:
        run = SyncScripts(client)
        events, seq = 0, 1
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for job_id in job_ids:
                run.run(plane_scripts.emit(settings, [(job_id, seq, _EVENT)]))
            events += len(job_ids)
            seq += 1
    sent.put(events)


def _main_thread_cpu_s(port: int) -> float:
    with redis.Redis(port=port) as client:
        info = client.info("cpu")
    return float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])


def _commands(port: int) -> int:
    """Commands the node ran, scripts' own calls included (its INFO calls left out)."""
    with redis.Redis(port=port) as client:
        stats = client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


@dataclass(frozen=True)
class Shard:
    port: int
    jobs: int
    cpu_s: float
    commands: int


@dataclass(frozen=True)
class Run:
    primaries: int
    events: int
    wall_s: float
    shards: list[Shard]

    @property
    def rate(self) -> float:
        return self.events / self.wall_s

    @property
    def sustained(self) -> float:
        """Tokens/s with the busiest shard's main thread at 100 %."""
        busiest = max(shard.cpu_s for shard in self.shards) / self.wall_s
        return self.rate / busiest


def measure(primaries: int, jobs: int, drivers: int, seconds: float) -> Run:
    with embedded_cluster(primaries) as cluster:
        return _measure(cluster, jobs, drivers, seconds)


def _measure(cluster: EmbeddedCluster, jobs: int, drivers: int, seconds: float) -> Run:
    settings = _settings(cluster.url)
    by_port: dict[int, list[str]] = {node.port: [] for node in cluster.nodes}
    per_shard = jobs // len(cluster.nodes)
    with redis.cluster.RedisCluster.from_url(cluster.url, decode_responses=True) as client:
        for n in itertools.count():
            if all(len(ids) == per_shard for ids in by_port.values()):
                break
            node = client.get_node_from_key(keys.job_channel(f"bench{n}"))
            assert node is not None
            if len(by_port[int(node.port)]) < per_shard:
                by_port[int(node.port)].append(f"bench{n}")
        job_ids = [job_id for ids in zip(*by_port.values(), strict=True) for job_id in ids]
        run = SyncScripts(client)
        started = Started(worker="bench", prompt_tokens=1).to_wire()
        for job_id in job_ids:
            run.run(plane_scripts.open_log(settings, job_id, started))
    stop = threading.Event()
    drains = [
        threading.Thread(
            target=drain,
            args=(port, [keys.job_channel(j) for j in ids], stop),
            kwargs={"subscribe": "SSUBSCRIBE"},
            daemon=True,
        )
        for port, ids in by_port.items()
        if ids
    ]
    for drainer in drains:
        drainer.start()
    sent: multiprocessing.Queue = multiprocessing.Queue()
    cpu0 = {port: _main_thread_cpu_s(port) for port in by_port}
    commands0 = {port: _commands(port) for port in by_port}
    t0 = time.perf_counter()
    processes = [
        multiprocessing.Process(
            target=_drive, args=(cluster.url, job_ids[i::drivers], seconds, sent)
        )
        for i in range(drivers)
    ]
    for process in processes:
        process.start()
    events = sum(sent.get(timeout=seconds + 60) for _ in processes)
    wall = time.perf_counter() - t0
    for process in processes:
        process.join(timeout=10)
    shards = [
        Shard(
            port,
            len(ids),
            _main_thread_cpu_s(port) - cpu0[port],
            _commands(port) - commands0[port],
        )
        for port, ids in by_port.items()
    ]
    stop.set()
    for drainer in drains:
        drainer.join(timeout=5)
    return Run(len(cluster.nodes), events, wall, shards)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.redis_shards", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per cluster size")
    parser.add_argument("--jobs", type=int, default=64, help="running jobs (streams)")
    parser.add_argument("--drivers", type=int, default=2, help="processes sending events")
    args = parser.parse_args(argv)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(
        "| primaries | shard | jobs on it | tokens/s (all) | shard commands per token (of all) "
        "| shard CPU µs per token (of all) | shard main thread busy "
        "| tok/s at 100 % of the busiest shard |"
    )
    print("|---|---|---|---|---|---|---|---|")
    runs = []
    for primaries in (1, 2):
        run = measure(primaries, args.jobs, args.drivers, args.seconds)
        runs.append(run)
        for index, shard in enumerate(run.shards):
            print(
                f"| {primaries} | {index + 1} | {shard.jobs} | {run.rate:,.0f} "
                f"| {shard.commands / run.events:.2f} "
                f"| {1e6 * shard.cpu_s / run.events:.2f} | {100 * shard.cpu_s / run.wall_s:.0f} % "
                f"| {run.sustained:,.0f} |"
            )
        sys.stdout.flush()
    one, two = runs
    per_token = [1e6 * s.cpu_s / r.events for r in runs for s in r.shards]
    print(
        f"\nsustained rate, 2 shards / 1 shard: {two.sustained / one.sustained:.2f}x; "
        f"busiest shard's CPU per token, 1 → 2 shards: {per_token[0]:.2f} → "
        f"{max(per_token[1:]):.2f} µs"
    )
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
