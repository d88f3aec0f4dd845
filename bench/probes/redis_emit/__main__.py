"""Redis cost of streaming one token event: the EMIT script, for jobs with and without a reader.

Runs `tokenrelay.shared.redis.plane_scripts.EMIT` (built by `plane_scripts.emit`, run as
production runs it, `shared.redis.scripts.SyncScripts`) directly against an embedded Redis
(no API, no worker), with one subscriber draining every channel as an API process would, and
prints Redis CPU and commands per event for several jobs-per-call batch sizes (a real
engine's decoding step carries every running job, so one EMIT call carries one event per
job). Per event EMIT costs an XADD `1-*` NOMKSTREAM and a PUBLISH, in two shapes:

- `own-channel`: jobs without a reader (submitted to run on their own): one PUBLISH per
  event, on the job's own channel.
- `reader`: jobs read by one API process (every chat or completion job: `reader_channels`):
  their events go on that process's channel, one PUBLISH per call.

The table gives each mode's cost against `own-channel`'s at the same batch size, measured in
the same run, and the load average it ran under. The earlier EMIT variants this probe once
compared (issue 13's, issue 16's first pass, a lean floor) are in git history and in the
lab notes, docs/lab-notes/.

    .venv/bin/python -m bench.probes.redis_emit [--seconds 3] [--batch 1,8,64]
    .venv/bin/python -m bench.probes.redis_emit --callgrind 200 --batch 64  # instructions per event

With `--callgrind CALLS`, Redis runs under valgrind's callgrind and each mode makes CALLS
calls: the table gives Redis's instructions per event, which the machine's load does not move
(the kernel's share, the socket reads and writes, is not in it).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
import uuid
from typing import Protocol

import redis

from bench.callgrind import CallgrindRedis
from bench.common import drain
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.redis import keys, plane_scripts
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings

MODES = ("own-channel", "reader")
_READER = "bench-api-process"
_STARTED = '{"type":"started"}'
_EVENT = '{"type":"token","text":"lorem ","tokens":1,"token_ids":[29256]}'
"""A one-token chunk as a worker sends it, with its token's id (what a continuation reads)."""


def _calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


class _Meter(Protocol):
    """What a measurement costs Redis: `start()`, then `stop()` returns the cost since."""

    def start(self) -> None: ...

    def stop(self) -> float: ...


class _CpuMeter:
    """Redis CPU in µs (`INFO cpu`)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._started = 0.0

    def _cpu_s(self) -> float:
        info = self._client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def start(self) -> None:
        self._started = self._cpu_s()

    def stop(self) -> float:
        return 1e6 * (self._cpu_s() - self._started)


class _InstructionMeter:
    """Instructions Redis ran (callgrind)."""

    def __init__(self, server: CallgrindRedis) -> None:
        self._server = server

    def start(self) -> None:
        self._server.zero()

    def stop(self) -> float:
        return float(self._server.instructions())


def measure(
    client: redis.Redis,
    port: int,
    batch: int,
    mode: str,
    settings: Settings,
    meter: _Meter,
    *,
    seconds: float = 0.0,
    calls: int = 0,
) -> tuple[float, float, float]:
    """(`meter`'s cost per event, Redis commands per event, events per second) of `calls`
    EMIT calls of `batch` events in `mode`, or of as many as `seconds` take."""
    scripts = SyncScripts(client)
    job_ids = [uuid.uuid4().hex for _ in range(batch)]
    for job_id in job_ids:  # each job's log, with its Started event (seq 0), as its worker opens it
        scripts.run(plane_scripts.open_log(settings, job_id, _STARTED))
    reader = keys.reader_channel(_READER)
    readers = {job_id: reader for job_id in job_ids} if mode == "reader" else None
    channels = [keys.job_channel(job_id) for job_id in job_ids] + [reader]
    stop = threading.Event()
    drainer = threading.Thread(target=drain, args=(port, channels, stop), daemon=True)
    drainer.start()
    time.sleep(0.2)
    seqs = itertools.count(1)

    def send() -> None:
        seq = next(seqs)  # EMIT keeps each job's next seq only
        events = [(job_id, seq, _EVENT) for job_id in job_ids]
        scripts.run(plane_scripts.emit(settings, events, readers))

    send()
    commands0, events = _calls(client), 0
    meter.start()
    t0 = time.perf_counter()
    while (calls and events < calls * batch) or (not calls and time.perf_counter() - t0 < seconds):
        send()
        events += batch
    wall = time.perf_counter() - t0
    cost = meter.stop()
    commands = _calls(client) - commands0
    stop.set()
    drainer.join()
    client.flushall()
    return cost / events, commands / events, events / wall


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.redis_emit", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per mode and batch")
    parser.add_argument("--batch", default="1,8,64", help="events (jobs) per script call")
    parser.add_argument(
        "--callgrind", type=int, metavar="CALLS", help="count instructions of CALLS calls"
    )
    args = parser.parse_args(argv)
    settings = Settings()
    server = CallgrindRedis() if args.callgrind else EmbeddedRedis()
    unit = "Redis instructions" if args.callgrind else "Redis CPU µs"
    print(f"load average (1, 5, 15 min) before: {_load()}\n")
    columns = ["mode", "events per call", f"{unit} per event", "vs own-channel"]
    columns.append("commands per event")
    columns += [] if args.callgrind else ["events/s"]
    print(f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
    with server:
        client = redis.Redis(port=server.port, decode_responses=True)
        meter = (
            _InstructionMeter(server) if isinstance(server, CallgrindRedis) else _CpuMeter(client)
        )
        for batch in (int(b) for b in args.batch.split(",")):
            base = 0.0
            for mode in MODES:
                cost, commands, rate = measure(
                    client,
                    server.port,
                    batch,
                    mode,
                    settings,
                    meter,
                    seconds=args.seconds,
                    calls=args.callgrind or 0,
                )
                base = base or cost
                row = f"| {mode} | {batch} | {cost:,.{0 if args.callgrind else 2}f} "
                row += f"| {cost / base:.2f} | {commands:.2f} |"
                print(row if args.callgrind else f"{row} {rate:,.0f} |", flush=True)
        client.close()
    print(f"\nload average (1, 5, 15 min) after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
