"""Redis CPU per request against how busy Redis is: the cost of waking it.

Runs `redis-benchmark` (PING, one command per round trip) against an embedded Redis with 1,
4, 16 and 64 clients and prints the Redis CPU each request cost (`INFO cpu`, user + sys)
and how much of it the kernel took. One client leaves Redis idle between requests, so each
one pays an event-loop wakeup; many keep it busy, so one wakeup serves several. Read the
gateway's Redis CPU per token next to this: at 64 streams Redis is a few percent busy, and
most of its CPU per token is wakeups, not work (docs/benchmarks/probes.md).

Then the latency of one such wakeup: one client's PING round trip (a raw socket, no client
library) with the client and Redis pinned to the same CPU and to two different ones, back to
back and with 1 ms idle between requests. Every hop of a request through the gateway (client
→ API → Redis → worker → Redis → API → client) is such a wakeup of another process.

    .venv/bin/python -m bench.probes.redis_wake [--requests 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import time

import redis

from bench.common import log
from tokenrelay.cli.embedded_redis import EmbeddedRedis

CLIENTS = (1, 4, 16, 64)
ROUND_TRIPS = 5_000


def _cpu_s(client: redis.Redis) -> tuple[float, float]:
    """(user + sys, sys) seconds of Redis CPU so far."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), float(info["used_cpu_sys"])


def _round_trips_us(port: int, idle_s: float) -> tuple[float, float]:
    """p50 and p99 µs of one client's PING round trips, `idle_s` apart."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(ROUND_TRIPS):
            sent = time.perf_counter()
            connection.sendall(b"PING\r\n")
            connection.recv(64)
            times.append(1e6 * (time.perf_counter() - sent))
            if idle_s:
                time.sleep(idle_s)
    times = times[ROUND_TRIPS // 10 :]  # past the warm-up
    return statistics.median(times), statistics.quantiles(times, n=100)[98]


def _latency_rows(client: redis.Redis, port: int) -> list[str]:
    """Round trips with this process and Redis on one CPU, then on two."""
    server_pid = int(client.info("server")["process_id"])
    mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(server_pid)
    placements = {"same CPU": (0, 0), "two CPUs": (0, 1)}
    rows = []
    try:
        for name, (my_cpu, server_cpu) in placements.items():
            os.sched_setaffinity(0, {my_cpu})
            os.sched_setaffinity(server_pid, {server_cpu})
            for idle_s in (0.0, 0.001):
                p50, p99 = _round_trips_us(port, idle_s)
                rows.append(f"| {name} | {idle_s * 1000:g} | {p50:.0f} | {p99:.0f} |")
    finally:
        os.sched_setaffinity(0, mine)
        os.sched_setaffinity(server_pid, theirs)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    options = parser.parse_args(argv)
    benchmark = shutil.which("redis-benchmark")
    if benchmark is None:
        raise SystemExit("redis-benchmark is not on PATH (apt-get install redis-tools)")
    log(f"load {os.getloadavg()}")
    rows = []
    with EmbeddedRedis() as server:
        client = redis.Redis(port=server.port)
        for clients in CLIENTS:
            total0, sys0 = _cpu_s(client)
            command = [benchmark, "-p", str(server.port), "-t", "ping_mbulk", "-q", "--csv"]
            command += ["-n", str(options.requests), "-c", str(clients)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            total1, sys1 = _cpu_s(client)
            per_s = float(out.strip().splitlines()[-1].split(",")[1].strip('"'))
            per_request = 1e6 * (total1 - total0) / options.requests
            kernel = 1e6 * (sys1 - sys0) / options.requests
            rows.append(f"| {clients} | {per_s:,.0f} | {per_request:.1f} | {kernel:.1f} |")
        latency = _latency_rows(client, server.port) if (os.cpu_count() or 1) >= 2 else []
    print(f"load {os.getloadavg()[0]:.1f}, {options.requests:,} PINGs per row\n")
    print("| clients | requests/s | Redis CPU µs per request | of which kernel µs |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    if latency:
        print(f"\nOne client's PING round trip ({ROUND_TRIPS:,} each, raw socket):\n")
        print("| client and Redis on | idle between, ms | round trip p50 µs | p99 µs |")
        print("|---|---|---|---|")
        print("\n".join(latency))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
