"""Redis CPU per request against how busy Redis is: the cost of waking it.

Runs `redis-benchmark` (PING, one command per round trip) against an embedded Redis with 1,
4, 16 and 64 clients and prints the Redis CPU each request cost (`INFO cpu`, user + sys)
and how much of it the kernel took. One client leaves Redis idle between requests, so each
one pays an event-loop wakeup; many keep it busy, so one wakeup serves several. Read the
gateway's Redis CPU per token next to this: at 64 streams Redis is a few percent busy, and
most of its CPU per token is wakeups, not work (bench/README.md, "Sixth pass").

    .venv/bin/python -m bench.redis_wake [--requests 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess

import redis

from bench.common import log
from tokenrelay.cli.embedded_redis import EmbeddedRedis

CLIENTS = (1, 4, 16, 64)


def _cpu_s(client: redis.Redis) -> tuple[float, float]:
    """(user + sys, sys) seconds of Redis CPU so far."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), float(info["used_cpu_sys"])


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
    print(f"load {os.getloadavg()[0]:.1f}, {options.requests:,} PINGs per row\n")
    print("| clients | requests/s | Redis CPU µs per request | of which kernel µs |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
