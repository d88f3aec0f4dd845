"""Redis cost of each script in a job's life, per call, on a quiet Redis of its own.

Runs ADMIT, START, one EMIT of the job's tokens and FINISH (carrying its last token) for
each of `--jobs` jobs, script by script (every job's ADMIT, then every START, ...), against
an embedded Redis (no API, no worker; the jobs name a reader, as chat and completion jobs
do, so their events go on its channel, which nobody reads here), and prints what Redis spent
inside each call next to the commands the script ran: the floor of tokenrelay's own per-job
Redis work, which `bench.gateway` measures end to end on a loaded box (where preemption
inflates it), against the per-token EMIT.

- time: EVALSHA's `usec` delta in `INFO commandstats`, each call measured alone;
- `--callgrind`: Redis runs under valgrind's callgrind, and the table gives its
  instructions per call (the whole server's, the reading of the request and the writing of
  the reply included), which the machine's load does not move.

    .venv/bin/python -m bench.probes.redis_scripts [--jobs 300] [--tokens 40] [--callgrind]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import redis

from bench.callgrind import CallgrindRedis
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts, scripts
from tokenrelay.shared.redis.scripts import ScriptCall, SyncScripts
from tokenrelay.shared.settings import Settings

_READER = "bench-api-process"


def _commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


def _evalsha_usec(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {"usec": 0})["usec"])


@dataclass
class Row:
    script: str
    cost_per_call: float
    commands_per_call: float


class Meter:
    """Runs each script's calls and what they cost Redis: µs inside EVALSHA, call by call,
    or (with `server`) the instructions of them all."""

    def __init__(self, client: redis.Redis, server: CallgrindRedis | None) -> None:
        self._client = client
        self._runner = SyncScripts(client)
        self._server = server
        self.rows: list[Row] = []

    def phase(self, script: str, calls: list[ScriptCall]) -> None:
        commands = _commands(self._client)
        cost = 0.0
        if self._server is not None:
            self._server.zero()
            for call in calls:
                self._runner.run(call)
            cost = float(self._server.instructions())
        else:
            for call in calls:
                before = _evalsha_usec(self._client)
                self._runner.run(call)
                cost += _evalsha_usec(self._client) - before
        spent = _commands(self._client) - commands
        self.rows.append(Row(script, cost / len(calls), spent / len(calls)))


def run_jobs(meter: Meter, settings: Settings, prefix: str, jobs: int, tokens: int) -> None:
    """Each job's scripts, script by script."""
    started = Started(worker="w", prompt_tokens=3).to_wire()
    token = TokenChunk(text="tok ", tokens=1).to_wire()
    usage = Usage(prompt_tokens=3, completion_tokens=tokens, total_tokens=3 + tokens)
    done = Done(finish_reason="length", usage=usage).to_wire()
    fields: dict[str, scripts.Arg] = {
        JobField.PROMPT_TOKENS: 3,
        JobField.COMPLETION_TOKENS: tokens,
    }
    ids = [f"{prefix}{i}" for i in range(jobs)]
    reader: dict[str, str] = {JobField.READER: _READER}
    channel = keys.reader_channel(_READER)
    meter.phase(
        "ADMIT", [job_scripts.admit(settings, i, "owner", "m", job_fields=reader) for i in ids]
    )
    meter.phase("START", [job_scripts.start(settings, i, "w", started) for i in ids])
    meter.phase(
        f"EMIT ({tokens - 1} events)",
        [
            plane_scripts.emit(
                settings, [(i, seq, token) for seq in range(1, tokens)], {i: channel}
            )
            for i in ids
        ],
    )
    text, status = "tok " * tokens, JobStatus.SUCCEEDED
    meter.phase(
        "FINISH (carrying 1 event)",
        [
            job_scripts.finish(
                settings, i, status, fields, done, tokens + 1, text, [(i, tokens, token)]
            )
            for i in ids
        ],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    args = parser.parse_args()
    counted = CallgrindRedis() if args.callgrind else None
    server = counted or EmbeddedRedis()
    with server:
        client = redis.Redis(port=server.port, decode_responses=True)
        settings = Settings(redis_url=server.url, max_inflight=args.jobs + 20)  # all at once
        run_jobs(Meter(client, counted), settings, "warm", 20, args.tokens)
        meter = Meter(client, counted)
        run_jobs(meter, settings, "job", args.jobs, args.tokens)
        client.close()
    unit = "instructions" if args.callgrind else "µs inside EVALSHA"
    print(f"{args.jobs} jobs of {args.tokens} tokens, script by script\n")
    print(f"| script | Redis {unit} per call | commands per call (EVALSHA + its own) |")
    print("|---|---|---|")
    for row in meter.rows:
        cost = f"{row.cost_per_call:,.0f}" if args.callgrind else f"{row.cost_per_call:.1f}"
        print(f"| {row.script} | {cost} | {row.commands_per_call:.1f} |")
    per_job = sum(row.cost_per_call for row in meter.rows if not row.script.startswith("EMIT"))
    total = f"{per_job:,.0f}" if args.callgrind else f"{per_job:.1f}"
    print(f"\nADMIT + START + FINISH: {total} {unit} per job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
