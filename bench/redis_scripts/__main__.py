"""Redis time of each script in a job's life, per call, on a quiet Redis of its own.

Runs ADMIT, START, one EMIT of the job's tokens and FINISH for each of `--jobs` jobs
against an embedded Redis (no API, no worker, no subscriber), and prints the time Redis
spent inside each call (`INFO commandstats`, EVALSHA's `usec` delta) next to the commands the
script ran: the floor of tokenrelay's own per-job Redis work, which `bench.gateway` measures
end to end on a loaded box (where preemption inflates it), against the per-token EMIT.

    .venv/bin/python -m bench.redis_scripts [--jobs 300] [--tokens 40]
"""

from __future__ import annotations

import argparse
from collections import Counter

import redis

from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared import scripts
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.script_runner import SyncScripts
from tokenrelay.shared.scripts import ScriptCall
from tokenrelay.shared.settings import Settings


def _calls(stats: dict[str, dict[str, int]]) -> int:
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


class Meter:
    """Redis time inside EVALSHA and commands run, per script name."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._runner = SyncScripts(client)
        self.usec: Counter[str] = Counter()
        self.commands: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def run(self, name: str, call: ScriptCall) -> None:
        before = self._client.info("commandstats")
        self._runner.run(call)
        after = self._client.info("commandstats")
        self.usec[name] += (
            after["cmdstat_evalsha"]["usec"] - before.get("cmdstat_evalsha", {"usec": 0})["usec"]
        )
        self.commands[name] += _calls(after) - _calls(before)
        self.calls[name] += 1


def run_jobs(meter: Meter, settings: Settings, prefix: str, jobs: int, tokens: int) -> None:
    started = Started(worker="w", prompt_tokens=3).to_wire()
    token = TokenChunk(text="tok ", tokens=1).to_wire()
    usage = Usage(prompt_tokens=3, completion_tokens=tokens, total_tokens=3 + tokens)
    done = Done(finish_reason="length", usage=usage).to_wire()
    fields: dict[str, scripts.Arg] = {
        JobField.PROMPT_TOKENS: 3,
        JobField.COMPLETION_TOKENS: tokens,
    }
    for i in range(jobs):
        job_id = f"{prefix}{i}"
        meter.run("ADMIT", scripts.admit(settings, job_id, "owner", "m"))
        meter.run("START", scripts.start(settings, job_id, "w", started))
        events = [(job_id, seq, token) for seq in range(1, tokens + 1)]
        meter.run(f"EMIT ({tokens} events)", scripts.emit(settings, events))
        text = "tok " * tokens
        finish = scripts.finish(
            settings, job_id, JobStatus.SUCCEEDED, fields, done, tokens + 1, text
        )
        meter.run("FINISH", finish)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        settings = Settings(redis_url=server.url)
        run_jobs(Meter(client), settings, "warm", 20, args.tokens)
        meter = Meter(client)
        run_jobs(meter, settings, "job", args.jobs, args.tokens)
        client.close()
    print(f"{args.jobs} jobs of {args.tokens} tokens, each script call timed alone\n")
    print("| script | Redis µs per call (inside EVALSHA) | commands per call (EVALSHA + its own) |")
    print("|---|---|---|")
    for name in meter.calls:
        n = meter.calls[name]
        print(f"| {name} | {meter.usec[name] / n:.1f} | {meter.commands[name] / n:.1f} |")
    per_job = sum(meter.usec[name] for name in meter.calls if not name.startswith("EMIT"))
    print(f"\nADMIT + START + FINISH: {per_job / args.jobs:.1f} µs per job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
