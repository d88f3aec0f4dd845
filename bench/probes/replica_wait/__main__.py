"""Latency cost of `TOKENRELAY_REDIS_MIN_REPLICAS=1`: an admission (ADMIT script) alone,
against ADMIT followed by the API's replica wait (INCR + WAIT 1 in one round trip), on a
local primary with one replica (`EmbeddedSentinel`). Prints a table of p50 / p99 in ms.

    .venv/bin/python -m bench.probes.replica_wait [--requests 500]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

from tokenrelay.shared.redis import job_scripts, keys
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.testing.sentinel import EmbeddedSentinel


def _admit_ms(run: SyncScripts, client: redis.Redis, settings: Settings, wait: bool) -> float:
    started = time.perf_counter()
    run.run(job_scripts.admit(settings, uuid.uuid4().hex, "bench", "m"))
    if wait:
        with client.pipeline(transaction=False) as pipe:
            pipe.incr(keys.replication_mark())
            pipe.execute_command("WAIT", 1, 1000)
            pipe.execute()
    return 1000 * (time.perf_counter() - started)


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.replica_wait", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=500, help="admissions per variant")
    args = parser.parse_args(argv)
    print("| admission | p50 ms | p99 ms |")
    print("|---|---|---|")
    with EmbeddedSentinel() as group:
        settings = Settings(redis_url=group.url, max_inflight=10 * args.requests)
        client = redis.Redis.from_url(group.url)
        run = SyncScripts(client)
        for name, wait in (("ADMIT", False), ("ADMIT + WAIT 1 (MIN_REPLICAS=1)", True)):
            samples = [_admit_ms(run, client, settings, wait) for _ in range(args.requests)]
            print(f"| {name} | {_quantile(samples, 0.5):.2f} | {_quantile(samples, 0.99):.2f} |")
            client.delete(keys.leases())
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
