"""The processes `bench.gateway` measures, and the probes it reads them with.

`BenchCluster` starts a real Redis (`tokenrelay.cli.embedded_redis`), N `tokenrelay api`
processes (one uvicorn process each, on its own port, so every API pid is known) and M
`tokenrelay worker` processes on the synthetic engine, on the shared process harness
(`tokenrelay.cli.harness`). `Snapshot` holds the counters that deltas are taken of:
`INFO commandstats` (commands run inside Lua scripts are counted there too), `INFO cpu`,
`INFO stats` network bytes, and each process's CPU time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis.asyncio

from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.cli.harness import ProcessGroup
from tokenrelay.shared.settings import Settings

MODEL_NAME = "bench-synthetic"
# Commands the benchmark itself sends while measuring; left out of the per-token counts.
PROBE_COMMANDS = frozenset({"info", "client|list"})


@dataclass(frozen=True)
class ClusterSpec:
    api_processes: int
    workers: int
    tokens_per_s: float
    first_token_ms: float
    flush_interval_ms: float
    worker_concurrency: int
    streams: int

    def env(self, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            TOKENRELAY_REDIS_URL=redis_url,
            TOKENRELAY_ENGINE="synthetic",
            TOKENRELAY_ALLOW_SYNTHETIC_ENGINE="1",
            TOKENRELAY_MODEL=MODEL_NAME,
            TOKENRELAY_SERVED_MODEL_NAME=MODEL_NAME,
            TOKENRELAY_SYNTHETIC_TOKENS_PER_S=str(self.tokens_per_s),
            TOKENRELAY_SYNTHETIC_FIRST_TOKEN_MS=str(self.first_token_ms),
            TOKENRELAY_FLUSH_INTERVAL_MS=str(self.flush_interval_ms),
            TOKENRELAY_WORKER_CONCURRENCY=str(self.worker_concurrency),
            TOKENRELAY_WORKER_MAX_BATCH_TOKENS=str(100_000_000),
            TOKENRELAY_MAX_INFLIGHT=str(1_000_000),
            TOKENRELAY_MAX_TOKENS_LIMIT=str(1_000_000),
            TOKENRELAY_RESULT_TTL_S="300",
            # Above the streams each API process holds (uvicorn answers a plain 503 past it),
            # as docs/operations/settings.md says to size it.
            TOKENRELAY_API_MAX_CONNECTIONS=str(max(1000, self.streams + 256)),
            PYTHONUNBUFFERED="1",
        )
        return env

    def settings(self, redis_url: str) -> Settings:
        """The settings the started processes read from `env()`, for the benchmark's own use."""
        prefix = "TOKENRELAY_"
        values = {
            name.removeprefix(prefix).lower(): value
            for name, value in self.env(redis_url).items()
            if name.startswith(prefix)
        }
        return Settings.model_validate(values)


@dataclass
class BenchCluster:
    """`with BenchCluster(spec) as cluster:` runs Redis, the API processes and the workers."""

    spec: ClusterSpec
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gateway-bench-")))
    api_ports: list[int] = field(default_factory=list)
    api: list[psutil.Process] = field(default_factory=list)
    workers: list[psutil.Process] = field(default_factory=list)
    _redis: EmbeddedRedis | None = None
    _group: ProcessGroup | None = None

    @property
    def redis_url(self) -> str:
        assert self._redis is not None
        return self._redis.url

    @property
    def redis_port(self) -> int:
        assert self._redis is not None
        return self._redis.port

    def __enter__(self) -> BenchCluster:
        self._redis = EmbeddedRedis()
        self._redis.start()
        self._group = ProcessGroup(env=self.spec.env(self.redis_url), log_dir=self.log_dir)
        try:
            for _ in range(self.spec.workers):
                worker = self._group.start_worker(self.redis_url)
                self.workers.append(psutil.Process(worker.pid))
            for _ in range(self.spec.api_processes):
                port = free_port()
                self.api.append(psutil.Process(self._group.start_api(port).pid))
                self.api_ports.append(port)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._group is not None:
            self._group.stop()
            self._group = None
        if self._redis is not None:
            self._redis.stop()
            self._redis = None


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@dataclass(frozen=True)
class Snapshot:
    """Counters at one instant; `Delta` is taken between two of them."""

    at_s: float
    commands: Counter[str]
    command_usec: Counter[str]
    redis_cpu_s: float
    net_in_bytes: int
    net_out_bytes: int
    cpu_s: dict[int, float]


async def snapshot(client: redis.asyncio.Redis, processes: list[psutil.Process]) -> Snapshot:
    at_s = time.perf_counter()
    cpu_s = {p.pid: cpu_seconds(p) for p in processes}
    info = await client.info("all")
    stats = {name[len("cmdstat_") :]: v for name, v in info.items() if name.startswith("cmdstat_")}
    return Snapshot(
        at_s=at_s,
        commands=Counter({name: int(v["calls"]) for name, v in stats.items()}),
        command_usec=Counter({name: int(v["usec"]) for name, v in stats.items()}),
        redis_cpu_s=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        net_in_bytes=int(info["total_net_input_bytes"]),
        net_out_bytes=int(info["total_net_output_bytes"]),
        cpu_s=cpu_s,
    )


@dataclass(frozen=True)
class Delta:
    wall_s: float
    commands: Counter[str]
    command_usec: Counter[str]
    """Time inside each command; a script's includes the commands it calls, which count
    again under their own names."""
    redis_cpu_s: float
    net_in_bytes: int
    net_out_bytes: int
    cpu_s: dict[int, float]

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot) -> Delta:
        commands = after.commands.copy()
        commands.subtract(before.commands)
        command_usec = after.command_usec.copy()
        command_usec.subtract(before.command_usec)
        for name in PROBE_COMMANDS:
            commands.pop(name, None)
            command_usec.pop(name, None)
        return cls(
            wall_s=after.at_s - before.at_s,
            commands=+commands,
            command_usec=+command_usec,
            redis_cpu_s=after.redis_cpu_s - before.redis_cpu_s,
            net_in_bytes=after.net_in_bytes - before.net_in_bytes,
            net_out_bytes=after.net_out_bytes - before.net_out_bytes,
            cpu_s={pid: after.cpu_s[pid] - before.cpu_s[pid] for pid in after.cpu_s},
        )


def redis_clients_by_pid(
    clients: list[dict[str, Any]], redis_port: int, processes: list[psutil.Process]
) -> Counter[int]:
    """Redis connections per local process: `CLIENT LIST` ports matched to each pid's sockets."""
    pid_of_port: dict[int, int] = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            for conn in process.net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == redis_port:
                    pid_of_port[conn.laddr.port] = process.pid
    counts: Counter[int] = Counter()
    for entry in clients:
        port = int(str(entry["addr"]).rsplit(":", 1)[1])
        counts[pid_of_port.get(port, 0)] += 1
    return counts


def pubsub_output_bytes(clients: list[dict[str, Any]]) -> int:
    """The largest output buffer (`omem`) of a subscribed client: pub/sub backlog."""
    return max(
        (int(c["omem"]) for c in clients if int(c.get("sub", 0)) + int(c.get("psub", 0))),
        default=0,
    )
