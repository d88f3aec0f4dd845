"""Chaos bench: a mixed load on 2 API processes and 2 workers (tiny Qwen2 model) while a
worker, an API process and Redis are killed and started again; then one table.

    .venv/bin/python -m bench.chaos               # 60 s of load, then the table
    .venv/bin/python -m bench.chaos --duration 90
    .venv/bin/python -m bench.chaos --persistence # Redis with AOF (everysec), SIGKILLed
    .venv/bin/python -m bench.chaos --failover    # Sentinel: the replica promoted mid-traffic
    .venv/bin/python -m bench.chaos --kill-workers 10  # SIGKILL a random worker every 10 s
    .venv/bin/python -m bench.chaos --stop-workers 10  # SIGTERM the workers in turn, every 10 s

The load: concurrent clients, each looping over streams, non-streaming completions, async
jobs (followed to their end over SSE, resumed with `Last-Event-ID` through the other API
when the connection drops), jobs cancelled with `DELETE`, and streams the client abandons
after the first token. Every client operation has a deadline (`OP_TIMEOUT_S`); one that
passes it counts as hung. The schedule: a worker is SIGKILLed and replaced, an API process is
SIGKILLed and restarted on its port, Redis is killed and restarted (empty: it has no
persistence, so jobs admitted before it vanish, and their clients get `redis_unavailable`);
the load goes on after each, for at least 20 s after Redis is back. With `--persistence`,
Redis keeps an append-only file (`appendfsync everysec`, as compose runs it) and restarts on
it: no accepted job may be lost, and every succeeded job's stored text must equal what its
client received (streamed, followed over SSE, or in the completion's body).
With `--failover`, Redis is a primary, a replica and three sentinels, every process follows
the primary through them with `TOKENRELAY_REDIS_MIN_REPLICAS=1`, and the only fault is
`SENTINEL FAILOVER` mid-traffic: the same two checks, and how long after the new primary
took writes a new request was first accepted.
With `--kill-workers N` (or `--stop-workers N`), three workers on a Redis with AOF, and the
only fault is a worker SIGKILLed at random (or SIGTERMed, the oldest first, with a short
drain) every N seconds and replaced: their running jobs continue on the other workers from
the tokens already delivered, so no job may fail (within its attempts), and the table adds
the migrations and the stall a stream's client saw at a seam (its longest wait between two
chunks, p50 and p99 over the streams that waited past a lease TTL).
After the load the bench waits for the lease set to drain, then reads every job record left
in Redis: none may be without a terminal state, and no lease may be left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx
import redis.asyncio

from bench.chaos.cluster import MODEL_NAME, ChaosCluster
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import keys
from tokenrelay.testing.sentinel import SERVICE, EmbeddedSentinel

LIMIT = 16
LEASE_TTL_S = 3.0
SETTINGS = {
    "TOKENRELAY_MAX_INFLIGHT": str(LIMIT),
    "TOKENRELAY_LEASE_TTL_S": str(LEASE_TTL_S),
    "TOKENRELAY_MAX_QUEUE_WAIT_S": "10",
    "TOKENRELAY_SSE_PING_S": "2",
    "TOKENRELAY_WORKER_DRAIN_S": "5",
    "OMP_NUM_THREADS": "1",  # two CPU workers share two cores with everything else
}
CLIENTS = 24
OP_TIMEOUT_S = 60.0
HTTP_TIMEOUT = httpx.Timeout(20.0, connect=5.0)
# keep-alive shorter than uvicorn's 5 s, so no request reuses a connection being closed
HTTP_LIMITS = httpx.Limits(keepalive_expiry=1.0)
DRAIN_TIMEOUT_S = 60.0
AFTER_REDIS_S = 20.0
FAILOVER_AFTER_S = 10.0
FAILOVER_SETTINGS = {
    "TOKENRELAY_REDIS_SENTINEL_MASTER": SERVICE,
    "TOKENRELAY_REDIS_MIN_REPLICAS": "1",
}


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    ERROR_EVENT = "ended with an error event"
    HTTP_ERROR = "answered with an HTTP error"
    CONNECTION = "connection failed (API process down)"
    CANCELLED = "cancelled by the client"
    HUNG = "hung"


@dataclass
class Tally:
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)
    admitted: dict[str, float] = field(default_factory=dict)  # job id -> first seen
    abandoned: set[str] = field(default_factory=set)
    most_leases: int = 0
    redis_restarted_at: float = float("inf")  # or, failing over, the new primary took writes
    lost_with_redis: int = 0
    accepted_at: list[float] = field(default_factory=list)  # a 202, a stream's 200: admitted
    received: dict[str, str] = field(default_factory=dict)  # succeeded job id -> its text
    longest_waits: list[float] = field(default_factory=list)  # per succeeded stream, seconds
    migrations: int = 0

    def admit(self, job_id: str) -> None:
        self.admitted.setdefault(job_id, time.monotonic())

    def record(self, outcome: Outcome, error: str | None = None) -> None:
        self.outcomes[outcome] += 1
        if error is not None:
            self.errors[f"{outcome.name.lower()}: {error}"] += 1


def body(max_tokens: int, *, long: bool = False, stream: bool = False) -> dict[str, object]:
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": f"chaos {random.random()}"}],
        "max_tokens": max_tokens,
        "min_tokens": max_tokens if long else 0,
        "stream": stream,
    }


class Load:
    """The client side: operations against the API processes, tallied."""

    def __init__(self, ports: list[int], tally: Tally) -> None:
        self.ports = ports
        self.tally = tally
        self.http = httpx.AsyncClient(timeout=HTTP_TIMEOUT, limits=HTTP_LIMITS)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{random.choice(self.ports)}{path}"

    async def stream(self, *, abandon: bool = False) -> None:
        tokens = 400 if abandon else random.randint(16, 64)
        payload = body(tokens, long=abandon, stream=True)
        async with self.http.stream("POST", self.url("/v1/chat/completions"), json=payload) as r:
            if r.status_code != 200:
                await r.aread()
                await self.refused(r)
                return
            self.tally.accepted_at.append(time.monotonic())
            finished = False
            job_id, text = "", ""
            last, longest = time.monotonic(), 0.0
            async for line in r.aiter_lines():
                now = time.monotonic()
                longest, last = max(longest, now - last), now
                if line == "data: [DONE]" and finished:
                    self.tally.record(Outcome.SUCCEEDED)
                    self.tally.received[job_id] = text
                    self.tally.longest_waits.append(longest)
                    return
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    self.tally.record(Outcome.ERROR_EVENT, chunk["error"]["code"])
                    return
                job_id = chunk["id"].removeprefix("chatcmpl-")
                self.tally.admit(job_id)
                choice = chunk["choices"][0] if chunk["choices"] else {}
                text += choice.get("delta", {}).get("content") or ""
                finished = finished or choice.get("finish_reason") is not None
                if abandon and choice.get("delta", {}).get("content"):
                    self.tally.abandoned.add(job_id)
                    self.tally.record(Outcome.CANCELLED)
                    return  # leaving the `async with` closes the connection mid-stream
            self.tally.record(Outcome.ERROR_EVENT, "stream ended without [DONE]")

    async def completion(self) -> None:
        r = await self.http.post(self.url("/v1/chat/completions"), json=body(32))
        if r.status_code == 200:
            job_id = r.json()["id"].removeprefix("chatcmpl-")
            self.tally.admit(job_id)
            self.tally.record(Outcome.SUCCEEDED)
            self.tally.received[job_id] = r.json()["choices"][0]["message"]["content"]
        else:
            await self.refused(r)

    async def job(self, *, cancel: bool = False) -> None:
        payload = body(400, long=True) if cancel else body(random.randint(16, 64))
        r = await self.http.post(self.url("/v1/jobs"), json=payload)
        if r.status_code != 202:
            await self.refused(r)
            return
        self.tally.accepted_at.append(time.monotonic())
        job_id = r.json()["id"]
        self.tally.admit(job_id)
        if cancel:
            await asyncio.sleep(random.uniform(0.1, 1.0))
            await self.http.delete(self.url(f"/v1/jobs/{job_id}"))
        await self.follow(job_id)

    async def follow(self, job_id: str) -> None:
        """Read the job's events to its end, resuming through any API after a dropped
        connection, as a client with `Last-Event-ID` does."""
        last_seq = -1
        text = ""
        while True:
            headers = {"Last-Event-ID": str(last_seq)} if last_seq >= 0 else {}
            try:
                async with self.http.stream(
                    "GET", self.url(f"/v1/jobs/{job_id}/events"), headers=headers
                ) as r:
                    if r.status_code != 200:
                        await r.aread()
                        self.tally.record(Outcome.HTTP_ERROR, r.json()["error"]["code"])
                        return
                    async for line in r.aiter_lines():
                        if line.startswith("id: "):
                            last_seq = int(line[4:])
                        elif line.startswith("data: "):
                            event = json.loads(line[6:])
                            if event.get("type") == "token":
                                text += event["text"]
                            if event.get("type") == "done":
                                self.tally.record(Outcome.SUCCEEDED)
                                self.tally.received[job_id] = text
                                return
                            if event.get("type") == "error" or "error" in event:
                                self.record_error(event)
                                return
            except httpx.TransportError:
                await asyncio.sleep(0.2)

    async def refused(self, response: httpx.Response) -> None:
        """Tally an HTTP error; back off as `Retry-After` says, as a polite client does."""
        self.tally.record(Outcome.HTTP_ERROR, response.json()["error"]["code"])
        if "retry-after" in response.headers:
            await asyncio.sleep(random.uniform(0.5, 1.0) * int(response.headers["retry-after"]))

    def record_error(self, event: dict[str, Any]) -> None:
        code = str(event["error_type"] if event.get("type") == "error" else event["error"]["code"])
        outcome = Outcome.CANCELLED if code == "cancelled" else Outcome.ERROR_EVENT
        self.tally.record(outcome, None if outcome is Outcome.CANCELLED else code)

    async def one(self) -> None:
        """One operation of the mix, within its deadline."""
        ops: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("stream", self.stream),
            ("stream", self.stream),
            ("completion", self.completion),
            ("job", self.job),
            ("job", self.job),
            ("cancel", lambda: self.job(cancel=True)),
            ("disconnect", lambda: self.stream(abandon=True)),
        ]
        name, op = random.choice(ops)
        self.tally.ops[name] += 1
        try:
            async with asyncio.timeout(OP_TIMEOUT_S):
                await op()
        except TimeoutError:
            self.tally.record(Outcome.HUNG, name)
        except httpx.TransportError as exc:
            self.tally.record(Outcome.CONNECTION, type(exc).__name__)

    def _load_ends(self, until: float) -> float:
        """`until`, or later where Redis restarted (or failed over): the load goes on after."""
        restarted = self.tally.redis_restarted_at
        return until if restarted == float("inf") else max(until, restarted + AFTER_REDIS_S)

    async def client(self, until: float) -> None:
        """Loop until `until`, and at least AFTER_REDIS_S past the Redis restart."""
        while time.monotonic() < self._load_ends(until):
            await self.one()
            await asyncio.sleep(random.uniform(0, 0.05))


async def sample_leases(redis_url: str, tally: Tally, stop: asyncio.Event) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=1)
    try:
        while not stop.is_set():
            try:
                tally.most_leases = max(tally.most_leases, await client.zcard(keys.leases()))
            except (redis.RedisError, OSError):
                await asyncio.sleep(0.05)
    finally:
        await client.aclose()


Log = Callable[[str], None]


async def chaos(
    cluster: ChaosCluster, server: EmbeddedRedis, ports: list[int], tally: Tally, log: Log
) -> None:
    """Kill and restart a worker, an API process and Redis, one after the other."""
    await asyncio.sleep(5)
    cluster.kill_worker(cluster.workers[0])
    log("SIGKILL worker; starting a replacement")
    await asyncio.to_thread(cluster.start_worker)
    log("replacement worker registered")
    await asyncio.sleep(3)
    cluster.kill_api(ports[1])
    log(f"SIGKILL API :{ports[1]}")
    await asyncio.sleep(2)
    await asyncio.to_thread(cluster.start_api, ports[1])
    log(f"API :{ports[1]} restarted")
    await asyncio.sleep(3)
    async with redis.asyncio.Redis.from_url(cluster.redis_url) as client:
        tally.lost_with_redis = int(await client.zcard(keys.leases()))
    server.stop()
    log(f"Redis killed with {tally.lost_with_redis} jobs in flight")
    await asyncio.sleep(3)
    await asyncio.to_thread(server.start)
    tally.redis_restarted_at = time.monotonic()
    log("Redis restarted " + ("on its append-only file" if server.persistent else "(empty)"))


async def failover(group: EmbeddedSentinel, tally: Tally, log: Log) -> None:
    """Ask the sentinels to promote the replica, after some load."""
    await asyncio.sleep(FAILOVER_AFTER_S)
    log(f"SENTINEL FAILOVER (primary :{group.primary_port()})")
    port = await asyncio.to_thread(group.failover)
    tally.redis_restarted_at = time.monotonic()
    log(f"new primary :{port} takes writes")


async def churn_workers(
    cluster: ChaosCluster, kill: bool, every_s: float, until: float, log: Log
) -> None:
    """Every `every_s` until `until`, SIGKILL a random worker (`kill`) or SIGTERM the oldest,
    and start a replacement, so three serve the load."""
    while time.monotonic() + every_s < until:
        await asyncio.sleep(every_s)
        if kill:
            cluster.kill_worker(random.choice(cluster.workers))
            log("SIGKILL a worker; starting a replacement")
        else:
            stopping = cluster.workers.pop(0)
            stopping.signal(signal.SIGTERM)
            log("SIGTERM the oldest worker; starting a replacement")
        await asyncio.to_thread(cluster.start_worker)
        log("replacement worker registered")


async def settle(redis_url: str) -> tuple[int, dict[str, str], dict[str, str]]:
    """Wait for the lease set to drain; then the leases left, every job record's status and
    every succeeded job's stored text."""
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while await client.zcard(keys.leases()) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        leases = int(await client.zcard(keys.leases()))
        statuses: dict[str, str] = {}
        depth = keys.job("id").count(":")
        async for key in client.scan_iter(match=keys.job("*"), count=1000):
            if key.count(":") == depth:  # not a job's event log, channel or text
                statuses[key.rsplit(":", 1)[1]] = str(await client.hget(key, JobField.STATUS))
        texts = {
            job_id: str(await client.get(keys.job_text(job_id)) or "")
            for job_id, status in statuses.items()
            if status == JobStatus.SUCCEEDED
        }
        return leases, statuses, texts
    finally:
        await client.aclose()


class Mode(StrEnum):
    PLAIN = "plain"
    PERSISTENCE = "persistence"
    FAILOVER = "failover"
    KILL_WORKERS = "kill-workers"
    STOP_WORKERS = "stop-workers"


CHURN_SETTINGS = {"TOKENRELAY_WORKER_DRAIN_S": "1"}
"""A stopping worker hands its jobs over after a second: the bench's streams are longer."""


Fault = Callable[[list[int]], Awaitable[None]]


async def run(
    duration_s: float, mode: Mode, every_s: float = 0.0, lease_ttl_s: float = LEASE_TTL_S
) -> None:
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {message}", flush=True)

    tally = Tally()
    if mode is Mode.FAILOVER:
        group = EmbeddedSentinel()
        settings = SETTINGS | FAILOVER_SETTINGS | {"TOKENRELAY_REDIS_SENTINELS": group.sentinels}
        with ChaosCluster(settings, redis_server=group) as cluster:
            outcome = await under_load(
                cluster,
                duration_s,
                tally,
                log,
                lambda ports: failover(group, tally, log),
                lambda: f"redis://127.0.0.1:{group.primary_port()}/0",
            )
    elif mode in (Mode.KILL_WORKERS, Mode.STOP_WORKERS):
        server = EmbeddedRedis(persistent=True)
        churn = CHURN_SETTINGS | {"TOKENRELAY_LEASE_TTL_S": str(lease_ttl_s)}
        with ChaosCluster(SETTINGS | churn, redis_server=server) as cluster:
            kill = mode is Mode.KILL_WORKERS
            outcome = await under_load(  # the fault starts with the load: its end is the load's
                cluster,
                duration_s,
                tally,
                log,
                lambda ports: churn_workers(
                    cluster, kill, every_s, time.monotonic() + duration_s, log
                ),
                lambda: server.url,
                workers=3,
            )
            async with redis.asyncio.Redis.from_url(server.url) as client:
                tally.migrations = int(await client.get(keys.migrations()) or 0)
    else:
        server = EmbeddedRedis(persistent=mode is Mode.PERSISTENCE)
        with ChaosCluster(SETTINGS, redis_server=server) as cluster:
            outcome = await under_load(
                cluster,
                duration_s,
                tally,
                log,
                lambda ports: chaos(cluster, server, ports, tally, log),
                lambda: server.url,
            )
    log("done")
    print_table(tally, *outcome, mode, lease_ttl_s)


async def under_load(
    cluster: ChaosCluster,
    duration_s: float,
    tally: Tally,
    log: Log,
    fault: Fault,
    primary_url: Callable[[], str],
    workers: int = 2,
) -> tuple[int, dict[str, str], dict[str, str]]:
    """Two API processes and `workers` workers under the clients' load while `fault` runs;
    then what `settle` reads from the primary."""
    ports = [cluster.start_api(), cluster.start_api()]
    for _ in range(workers):
        cluster.start_worker()
    log(f"2 API processes {ports}, {workers} workers, Redis {cluster.redis_url}; load starts")
    load = Load(ports, tally)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_leases(cluster.redis_url, tally, stop))
    until = time.monotonic() + duration_s
    try:
        await asyncio.gather(fault(ports), *(load.client(until) for _ in range(CLIENTS)))
        log("load stopped; waiting for the leases to drain")
        return await settle(primary_url())
    finally:
        stop.set()
        await sampler
        await load.http.aclose()


def print_table(
    tally: Tally,
    leases: int,
    statuses: dict[str, str],
    texts: dict[str, str],
    mode: Mode,
    lease_ttl_s: float,
) -> None:
    terminal = {status.value for status in JobStatus if status.is_terminal}
    unfinished = [job_id for job_id, status in statuses.items() if status not in terminal]
    before = {j for j, seen in tally.admitted.items() if seen < tally.redis_restarted_at}
    missing = tally.admitted.keys() - before - statuses.keys()
    differs = [j for j, text in tally.received.items() if j in texts and texts[j] != text]
    kept = [
        ("accepted jobs lost (must be 0)", len(tally.admitted.keys() - statuses.keys())),
        ("  records in Redis at the end", len(statuses)),
    ]
    wiped = [
        ("  before the Redis restart (records wiped with it)", len(before)),
        ("  in flight when Redis was killed: lost with it", tally.lost_with_redis),
        ("  after it: records in Redis at the end", len(statuses)),
        ("  after it: admitted but no record (must be 0)", len(missing)),
    ]
    abandoned = Counter(statuses.get(j, "wiped with Redis") for j in tally.abandoned)
    rows = [
        ("requests sent", sum(tally.ops.values())),
        *((f"  {outcome.value}", tally.outcomes[outcome]) for outcome in Outcome),
        ("jobs admitted (seen by clients)", len(tally.admitted)),
        *(wiped if mode is Mode.PLAIN else kept),
        ("succeeded jobs whose text differs from what was streamed (must be 0)", len(differs)),
        ("  succeeded jobs compared", sum(j in texts for j in tally.received)),
        ("jobs without a terminal state (must be 0)", len(unfinished)),
        ("leases left (must be 0)", leases),
        ("max concurrently admitted / limit", f"{tally.most_leases} / {LIMIT}"),
    ]
    if mode in (Mode.KILL_WORKERS, Mode.STOP_WORKERS):
        stalls = sorted(wait for wait in tally.longest_waits if wait > lease_ttl_s)
        rows += [
            ("jobs continued on another worker (migrations)", tally.migrations),
            ("streams that waited past a lease TTL at once", len(stalls)),
            ("  their longest wait, p50 / p99 (s)", _percentiles(stalls)),
            (
                "longest wait of the other streams, p99 (s)",
                _percentiles([w for w in tally.longest_waits if w <= lease_ttl_s]).split(" / ")[1],
            ),
        ]
    if mode is Mode.FAILOVER:
        after = [t - tally.redis_restarted_at for t in tally.accepted_at]
        first = min((t for t in after if t >= 0), default=None)
        rows.append(
            (
                "first request accepted after the new primary took writes (s)",
                "none" if first is None else f"{first:.1f}",
            )
        )
    width = max(len(label) for label, _ in rows)
    print()
    for label, value in rows:
        print(f"{label:<{width}}  {value:>8}")
    print("\nmix:", ", ".join(f"{name} {n}" for name, n in sorted(tally.ops.items())))
    final = Counter(statuses.values())
    print("final job states:", ", ".join(f"{s} {n}" for s, n in sorted(final.items())))
    if mode is Mode.FAILOVER:
        later = Counter(
            statuses.get(j, "lost")
            for j, seen in tally.admitted.items()
            if seen >= tally.redis_restarted_at
        )
        print("  of jobs seen after it:", ", ".join(f"{s} {n}" for s, n in sorted(later.items())))
    print("abandoned streams ended:", ", ".join(f"{s} {n}" for s, n in sorted(abandoned.items())))
    print("errors:", ", ".join(f"{e} {n}" for e, n in tally.errors.most_common()) or "none")


def _percentiles(values: list[float]) -> str:
    """`p50 / p99` of `values` (seconds), or `none`."""
    if not values:
        return "none / none"
    ordered = sorted(values)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    return f"{at(0.5):.1f} / {at(0.99):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    faults = parser.add_mutually_exclusive_group()
    faults.add_argument(
        "--persistence", action="store_true", help="Redis with an append-only file (everysec)"
    )
    faults.add_argument(
        "--failover", action="store_true", help="Sentinel-managed Redis, failed over mid-traffic"
    )
    faults.add_argument(
        "--kill-workers", type=float, metavar="S", help="SIGKILL a random worker every S s"
    )
    faults.add_argument(
        "--stop-workers", type=float, metavar="S", help="SIGTERM the workers in turn, every S s"
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=LEASE_TTL_S,
        metavar="S",
        help="the workers' lease TTL with --kill-workers or --stop-workers",
    )
    args = parser.parse_args()
    mode = Mode.FAILOVER if args.failover else Mode.PERSISTENCE if args.persistence else Mode.PLAIN
    every_s = args.kill_workers or args.stop_workers or 0.0
    if args.kill_workers:
        mode = Mode.KILL_WORKERS
    elif args.stop_workers:
        mode = Mode.STOP_WORKERS
    # A SIGTERM (`timeout`, say) leaves through Python, so the processes the bench started
    # are stopped on the way out rather than left running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    asyncio.run(run(args.duration, mode, every_s, args.lease_ttl))


if __name__ == "__main__":
    main()
