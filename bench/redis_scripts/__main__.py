"""Redis cost of each script in a job's life, per call, on a quiet Redis of its own.

Runs ADMIT, START, one EMIT of the job's tokens and FINISH (carrying its last token) for
each of `--jobs` jobs, script by script (every job's ADMIT, then every START, ...), against
an embedded Redis (no API, no worker; the jobs name a reader, as chat and completion jobs
do, so their events go on its channel, which nobody reads here), and prints what Redis spent
inside each call next to the commands the script ran: the floor of tokenrelay's own per-job
Redis work, which `bench.gateway` measures end to end on a loaded box (where preemption
inflates it), against the per-token EMIT. FINISH runs twice over, for two sets of jobs
enqueued and started in RQ: making RQ's record of the job's success itself (as a worker's
FINISH does), and without it, followed by that record in a transaction of its own (as
before).

- time: the `usec` delta of EVALSHA and EXEC in `INFO commandstats`, each call measured
  alone;
- `--callgrind`: Redis runs under valgrind's callgrind, and the table gives its
  instructions per call (the whole server's, the reading of the request and the writing of
  the reply included), which the machine's load does not move.

    .venv/bin/python -m bench.redis_scripts [--jobs 300] [--tokens 40] [--callgrind]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import redis
from rq.utils import now

from bench.callgrind import CallgrindRedis
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared import keys, scripts
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.rq_jobs import GENERATE_FUNCTION, generation_queue
from tokenrelay.shared.script_runner import SyncScripts
from tokenrelay.shared.scripts import ScriptCall, Writes
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.rq_worker import build_worker

_READER = "bench-api-process"


def _commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


def _top_level_usec(client: redis.Redis) -> int:
    """µs inside EVALSHA and EXEC (each includes the commands it runs)."""
    stats = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {"usec": 0})["usec"]) for name in ("evalsha", "exec")
    )


@dataclass
class Row:
    script: str
    cost_per_call: float
    commands_per_call: float


class Meter:
    """Runs each phase's actions (a script call, or a call and a transaction) and what they
    cost Redis: µs inside EVALSHA and EXEC, action by action, or (with `server`) the
    instructions of them all."""

    def __init__(self, client: redis.Redis, server: CallgrindRedis | None) -> None:
        self.client = client
        self.runner = SyncScripts(client)
        self._server = server
        self.rows: list[Row] = []

    def phase(self, script: str, calls: list[ScriptCall]) -> None:
        self.actions(script, [partial(self.runner.run, call) for call in calls])

    def actions(self, name: str, actions: list[Callable[[], object]]) -> None:
        commands = _commands(self.client)
        cost = 0.0
        if self._server is not None:
            self._server.zero()
            for action in actions:
                action()
            cost = float(self._server.instructions())
        else:
            for action in actions:
                before = _top_level_usec(self.client)
                action()
                cost += _top_level_usec(self.client) - before
        spent = _commands(self.client) - commands
        self.rows.append(Row(name, cost / len(actions), spent / len(actions)))


def rq_records(client: redis.Redis, ids: list[str]) -> dict[str, Writes]:
    """RQ's record of each job's success, as a worker makes it: each job enqueued in RQ and
    its start recorded there first."""
    connection = redis.Redis(port=client.connection_pool.connection_kwargs["port"])
    queue = generation_queue(connection, "m", "normal")
    worker = build_worker(connection, "bench-worker", {}, model="m")
    records = {}
    for job_id in ids:
        job = queue.enqueue_call(GENERATE_FUNCTION, kwargs={}, job_id=job_id)
        job.started_at = now()
        records[job_id] = worker.success_writes(
            job, worker.record_start(job), {"status": "succeeded"}
        )
    return records


def _transaction(client: redis.Redis, writes: Writes) -> None:
    with client.pipeline() as pipe:
        for name, key, args in writes.commands:
            pipe.execute_command(name, key, *args)
        pipe.execute()


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
    meter.phase("ADMIT", [scripts.admit(settings, i, "owner", "m", job_fields=reader) for i in ids])
    meter.phase("START", [scripts.start(settings, i, "w", started) for i in ids])
    meter.phase(
        f"EMIT ({tokens - 1} events)",
        [
            scripts.emit(settings, [(i, seq, token) for seq in range(1, tokens)], {i: channel})
            for i in ids
        ],
    )
    text, status = "tok " * tokens, JobStatus.SUCCEEDED
    records = rq_records(meter.client, ids)

    def finish(i: str, writes: Writes | None) -> ScriptCall:
        carried = [(i, tokens, token)]
        return scripts.finish(settings, i, status, fields, done, tokens + 1, text, carried, writes)

    half = ids[: len(ids) // 2]
    meter.phase(
        "FINISH (carrying 1 event), RQ's record in it", [finish(i, records[i]) for i in half]
    )
    meter.actions(
        "FINISH (carrying 1 event), then RQ's record in a transaction",
        [
            partial(_finish_then_record, meter, finish(i, None), records[i])
            for i in ids[len(half) :]
        ],
    )


def _finish_then_record(meter: Meter, finish: ScriptCall, record: Writes) -> None:
    meter.runner.run(finish)
    _transaction(meter.client, record)


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
    unit = "instructions" if args.callgrind else "µs inside EVALSHA and EXEC"
    print(f"{args.jobs} jobs of {args.tokens} tokens, script by script\n")
    print(f"| script | Redis {unit} per call | commands per call (EVALSHA + its own) |")
    print("|---|---|---|")
    for row in meter.rows:
        cost = f"{row.cost_per_call:,.0f}" if args.callgrind else f"{row.cost_per_call:.1f}"
        print(f"| {row.script} | {cost} | {row.commands_per_call:.1f} |")
    per_job = sum(row.cost_per_call for row in meter.rows[:2])
    for row in meter.rows[3:]:
        job_cost = per_job + row.cost_per_call
        total = f"{job_cost:,.0f}" if args.callgrind else f"{job_cost:.1f}"
        print(f"\nADMIT + START + {row.script}: {total} {unit} per job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
