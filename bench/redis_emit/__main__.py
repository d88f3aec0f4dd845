"""Redis cost of streaming one token event: today's EMIT script against a leaner variant.

Runs each script directly against an embedded Redis (no API, no worker), with one subscriber
draining every job channel as an API process would, and prints Redis CPU and commands per
event for several jobs-per-call batch sizes (a real engine's decoding step carries every
running job, so one EMIT call carries one event per job).

- `current`: `tokenrelay.shared.scripts.EMIT` — per event XADD `1-*` NOMKSTREAM (the log
  numbers the event; it is kept only when that is the worker's seq, and refused once the job
  ended: its log is closed) and PUBLISH on the job's channel; no text (FINISH stores it
  whole): a job without a reader (submitted to run on its own).
- `reader`: the same script for jobs read by one API process (every chat or completion job:
  `scripts.emit`'s `reader_channels`): their events go on that process's channel, one PUBLISH per
  call.
- `issue-16a`: EMIT as issue 16's first pass landed it (`ISSUE_16A_EMIT_BODY`), for the
  ratio in the same run — per event HINCRBY next_seq, XADD, PUBLISH.
- `issue-13`: EMIT as issue 13 landed it (`PREVIOUS_EMIT_BODY` on today's library and
  `PREVIOUS_APPEND`), for the ratio in the same run — per event HMGET status, cancel flag
  and next_seq, HSET next_seq, XADD, PUBLISH, APPEND.
- `lean` (the floor, not used by tokenrelay: no resend or gap check): per event XADD with
  an auto sequence (`1-*`, Redis >= 7.0; the entry id carries `seq`) and PUBLISH, no text.

    .venv/bin/python -m bench.redis_emit [--seconds 3] [--batch 1,8,64]
    .venv/bin/python -m bench.redis_emit --callgrind 200 --batch 64   # instructions per event

With `--callgrind CALLS`, Redis runs under valgrind's callgrind and each variant makes CALLS
calls: the table gives Redis's instructions per event, which the machine's load does not move
(the kernel's share, the socket reads and writes, is not in it).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import redis
from redis.typing import EncodableT, FieldT

from bench.callgrind import CallgrindRedis
from bench.common import drain
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared import keys, scripts
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.settings import Settings

LEAN_EMIT = r"""
-- ARGV[1] log key template, ARGV[2] channel key template, ARGV[3] log MAXLEN,
-- ARGV[4..] pairs: job id, event JSON without seq. Returns the ids of ended jobs.
local function key(template, id)
  return (string.gsub(template, '{id}', id))
end
local stopped = {}
for i = 4, #ARGV, 2 do
  local id, event = ARGV[i], ARGV[i + 1]
  local entry = redis.pcall('XADD', key(ARGV[1], id), 'MAXLEN', '~', ARGV[3], '1-*', 'e', event)
  if type(entry) == 'table' and entry.err then
    table.insert(stopped, id)
  else
    local seq = string.sub(entry, 3)
    redis.call('PUBLISH', key(ARGV[2], id), '{"seq":' .. seq .. ',' .. string.sub(event, 2))
  end
end
return stopped
"""

PREVIOUS_APPEND = r"""
local function append(id, seq, event)
  local payload = '{"seq":' .. seq .. ',' .. string.sub(event, 2)
  local added = redis.pcall('XADD', key(T_LOG, id), 'MAXLEN', '~', LOG_MAXLEN, '1-' .. seq,
    'e', payload)
  if type(added) == 'table' and added.err then
    return false
  end
  redis.call('PUBLISH', key(T_CHAN, id), payload)
  return true
end
"""

ISSUE_16A_EMIT_BODY = r"""
local gone, behind, refused = {}, {}, {}

-- A seq that is not the job's next: gone, a gap, or (else) a resend that is a no-op.
local function refuse(id, h, next_seq, seq)
  local status = redis.call('HGET', h, F_STATUS)
  if status ~= S_RUNNING then
    if not status then
      redis.call('DEL', h)  -- the HINCRBY made the hash of an unknown job
    end
    refused[id] = true
    table.insert(gone, id)
  elseif seq > next_seq then
    refused[id] = true
    table.insert(behind, id)
    table.insert(behind, next_seq)
  end
end

for i = 8, #ARGV, 3 do
  local id = ARGV[i]
  if not refused[id] then
    local h = key(T_HASH, id)
    local seq = tonumber(ARGV[i + 1])
    local next_seq = redis.call('HINCRBY', h, F_NEXT_SEQ, 1) - 1
    if next_seq ~= seq or seq == 0 then  -- seq 0 is START's, never EMIT's
      redis.call('HINCRBY', h, F_NEXT_SEQ, -1)
      refuse(id, h, next_seq, seq)
    elseif not append(id, seq, ARGV[i + 2]) then
      redis.call('HINCRBY', h, F_NEXT_SEQ, -1)
      refused[id] = true
      table.insert(gone, id)
    end
  end
end
return {gone, behind}
"""

PREVIOUS_EMIT_BODY = r"""
local cancelled, gone, behind, refused, flagged = {}, {}, {}, {}, {}
for i = 8, #ARGV, 4 do
  local id = ARGV[i]
  if not refused[id] then
    local h = key(T_HASH, id)
    local status, cancelling, next_seq = unpack(redis.call('HMGET', h, F_STATUS,
      F_CANCEL_REQUESTED, F_NEXT_SEQ))
    local seq = tonumber(ARGV[i + 1])
    if status ~= S_RUNNING then
      refused[id] = true
      table.insert(gone, id)
    elseif seq > tonumber(next_seq) then
      refused[id] = true
      table.insert(behind, id)
      table.insert(behind, tonumber(next_seq))
    else
      if seq == tonumber(next_seq) then
        redis.call('HSET', h, F_NEXT_SEQ, seq + 1)
        append(id, seq, ARGV[i + 2])
        if ARGV[i + 3] ~= '' then
          redis.call('APPEND', key(T_TEXT, id), ARGV[i + 3])
        end
      end
      if cancelling and not flagged[id] then
        flagged[id] = true
        table.insert(cancelled, id)
      end
    end
  end
end
return {cancelled, gone, behind}
"""

_BODIES: dict[str, str | None] = {
    "issue-13": PREVIOUS_EMIT_BODY,
    "issue-16a": ISSUE_16A_EMIT_BODY,
    "current": None,
    "reader": None,
}
_READER = "bench-api-process"
_EVENT = '{"type":"token","text":"lorem ","tokens":1}'


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
    variant: str,
    settings: Settings,
    meter: _Meter,
    *,
    seconds: float = 0.0,
    calls: int = 0,
) -> tuple[float, float, float]:
    """(`meter`'s cost per event, Redis commands per event, events per second) of `calls`
    calls, or of as many as `seconds` take."""
    job_ids = [uuid.uuid4().hex for _ in range(batch)]
    running: dict[FieldT, EncodableT] = {JobField.STATUS: JobStatus.RUNNING, JobField.NEXT_SEQ: 1}
    for job_id in job_ids:
        client.hset(keys.job(job_id), mapping=running)
        client.xadd(keys.job_events(job_id), {"e": _EVENT}, id="1-0")  # START's event
    stop = threading.Event()
    reader = keys.reader_channel(_READER)
    channels = [keys.job_channel(job_id) for job_id in job_ids] + [reader]
    readers = {job_id: reader for job_id in job_ids} if variant == "reader" else None
    drainer = threading.Thread(target=drain, args=(port, channels, stop), daemon=True)
    drainer.start()
    time.sleep(0.2)
    send: Callable[[], object]
    if variant in _BODIES:
        # The earlier EMITs ran on the job library (clock, plane and library, as ADMIT's
        # source opens) with its header of ARGV (as REAP's call carries it).
        library = scripts.ADMIT[: scripts.ADMIT.index("-- ADMIT:")]
        library_call = scripts.reap(settings)
        body = _BODIES[variant]
        next_seq = f"local F_NEXT_SEQ = '{JobField.NEXT_SEQ}'\n"  # the job library has none
        source = scripts.EMIT if body is None else library + next_seq + PREVIOUS_APPEND + body
        script = client.register_script(source)
        sent = itertools.count(1)

        def send() -> object:
            seq = next(sent)  # EMIT applies each job's next seq only
            events = [(job_id, seq, _EVENT) for job_id in job_ids]
            call = scripts.emit(settings, events, readers)
            if body is None:
                return script(keys=call.keys, args=call.args)
            header = library_call.args[: scripts.LIBRARY_ARGC]
            items = [part for job_id in job_ids for part in (job_id, seq, _EVENT)]
            if variant == "issue-13":  # quadruples: its text delta after each event
                items = [p for i in range(0, len(items), 3) for p in (*items[i : i + 3], "lorem ")]
            return script(keys=library_call.keys, args=[*header, *items])

    else:
        script = client.register_script(LEAN_EMIT)
        lean_args: list[str | int] = [keys.job_events("{id}"), keys.job_channel("{id}")]
        lean_args.append(settings.event_log_maxlen)
        for job_id in job_ids:
            lean_args += [job_id, _EVENT]
        send = lambda: script(keys=[], args=lean_args)  # noqa: E731
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_emit", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per variant and batch")
    parser.add_argument("--batch", default="1,8,64", help="events (jobs) per script call")
    parser.add_argument(
        "--callgrind", type=int, metavar="CALLS", help="count instructions of CALLS calls"
    )
    args = parser.parse_args(argv)
    settings = Settings()
    server: EmbeddedRedis
    if args.callgrind:
        server = CallgrindRedis()
        print("| variant | events per call | Redis instructions per event | commands per event |")
        print("|---|---|---|---|")
    else:
        server = EmbeddedRedis()
        print(
            "| variant | events per call | Redis CPU µs per event | commands per event | events/s |"
        )
        print("|---|---|---|---|---|")
    with server:
        client = redis.Redis(port=server.port, decode_responses=True)
        meter = (
            _InstructionMeter(server) if isinstance(server, CallgrindRedis) else _CpuMeter(client)
        )
        for batch in (int(b) for b in args.batch.split(",")):
            for variant in (*_BODIES, "lean"):
                cost, commands, rate = measure(
                    client,
                    server.port,
                    batch,
                    variant,
                    settings,
                    meter,
                    seconds=args.seconds,
                    calls=args.callgrind or 0,
                )
                row = f"| {variant} | {batch} | {cost:,.{0 if args.callgrind else 1}f} "
                row += f"| {commands:.2f} |"
                print(row if args.callgrind else f"{row} {rate:,.0f} |")
                sys.stdout.flush()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
