"""The batch feeder: a loop in every API process that runs batches on spare capacity.

API processes are stateless, so a batch is not tied to the one that created it: each
feeder claims unfinished batches through a lease in Redis (`batch_claim.lua`), renews it
every tick, and a batch whose feeder died (SIGKILL, lost node) is claimed by another once
the lease runs out, `TOKENRELAY_BATCH_LEASE_S`. Everything a feeder knows of a batch is
in Redis (`api.batches.run`), so the next one carries on where it stopped.

Each tick (`TICK_S`; `IDLE_TICK_S` while the feeder holds no batch, unless this process
records one, which wakes it at once): validate new batches (`api.batches.validation`);
collect the lines whose jobs ended; admit more lines as low-priority jobs, one per batch
owner in turn (fair between keys), until the admission script defers them: batch lines may hold
at most `TOKENRELAY_BATCH_MAX_INFLIGHT_SHARE` of `MAX_INFLIGHT`, only while the cluster
has room, and are left out of interactive admission's count (`admit.lua`), so interactive
requests are never refused for slots batch lines hold; stop cancelled and expired
batches; write the files of the finished (`api.batches.finalize`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict
from typing import cast

from redis.exceptions import RedisError

from tokenrelay.api.batches import run as batch_run
from tokenrelay.api.batches.finalize import finalize, retire
from tokenrelay.api.batches.models import BatchField, BatchStatus
from tokenrelay.api.batches.run import BatchRun
from tokenrelay.api.batches.store import transition
from tokenrelay.api.batches.validation import validate
from tokenrelay.api.metrics import Metrics
from tokenrelay.api.state import AppState
from tokenrelay.shared.redis import batch_scripts, keys

log = logging.getLogger(__name__)

TICK_S = 0.1
IDLE_TICK_S = 1.0
"""How often a feeder that holds no batch claims: a claim is a script call (~100 µs inside
Redis on a 2-core box), so ten a second from every API process was Redis CPU spent whatever
the load. A batch another process recorded waits at most this long for a feeder when its
own feeder is full or gone; one recorded here wakes this feeder (`AppState.batch_created`)."""
MAX_HELD = 8  # batches one feeder runs at once; more wait for another feeder or a free slot


class BatchFeeder:
    def __init__(self, state: AppState, metrics: Metrics) -> None:
        self.state = state
        self.metrics = metrics
        self.feeder_id = uuid.uuid4().hex
        self.held: list[str] = []

    async def run_forever(self) -> None:
        while True:
            try:
                await self.tick()
            except RedisError as exc:
                log.warning("batch feeding skipped: %s", exc)
            except Exception:
                log.exception("batch feeder tick failed")
            await self._wait()

    async def _wait(self) -> None:
        if self.held:
            await asyncio.sleep(TICK_S)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(IDLE_TICK_S):
                await self.state.batch_created.wait()
        self.state.batch_created.clear()

    async def renew(self, *, claim: bool = False) -> None:
        lease_ms = int(self.state.settings.batch_lease_s * 1000)
        max_new = MAX_HELD - len(self.held) if claim else 0
        call = batch_scripts.claim(self.feeder_id, lease_ms, max_new, self.held, BatchField.FEEDER)
        claimed, lost = await self.state.scripts.run(call)
        self.held = [b for b in self.held if b not in set(lost)] + [str(b) for b in claimed]

    async def tick(self) -> None:
        await self.renew(claim=True)
        runs: list[BatchRun] = []
        for batch_id in list(self.held):
            fields = cast("dict[str, str]", await self.state.redis.hgetall(keys.batch(batch_id)))
            status = fields.get(BatchField.STATUS)
            if status is None or BatchStatus(status).is_terminal:
                await retire(self.state, batch_id)  # failed validation, or a finalizer died
                self.held.remove(batch_id)
            elif status == BatchStatus.VALIDATING:
                await self._validate(batch_id, fields)
            elif status == BatchStatus.FINALIZING:
                await finalize(self.state, batch_id, fields)
            else:
                runs.append(await batch_run.load(self.state, batch_id, fields, self._count))
        for run in runs:
            await self._stop_if_due(run)
            await batch_run.collect(self.state, run)
        await self._feed([run for run in runs if run.has_work()])
        for run in runs:
            if run.stop is not None and (run.next_line < run.total or run.waiting):
                await batch_run.stop_unstarted(self.state, run)
            if not run.pending and run.next_line >= run.total:
                await finalize(self.state, run.batch_id, run.fields)

    def _count(self, outcome: str) -> None:
        self.metrics.batch_lines.labels(outcome=outcome).inc()

    async def _validate(self, batch_id: str, fields: dict[str, str]) -> None:
        endpoint, file_id = fields[BatchField.ENDPOINT], fields[BatchField.INPUT_FILE_ID]
        count, errors = await validate(self.state, batch_id, file_id, endpoint, self.renew)
        now = int(time.time())
        if errors is not None:
            await transition(
                self.state,
                batch_id,
                (BatchStatus.VALIDATING,),
                BatchStatus.FAILED,
                {"failed_at": now, BatchField.ERRORS: errors.model_dump_json()},
            )
            return
        await self.state.redis.hset(keys.batch(batch_id), BatchField.TOTAL, count)
        await transition(
            self.state,
            batch_id,
            (BatchStatus.VALIDATING,),
            BatchStatus.IN_PROGRESS,
            {"in_progress_at": now},
        )

    async def _stop_if_due(self, run: BatchRun) -> None:
        if run.stop is None and batch_run.expired(run):
            await self.state.redis.hsetnx(keys.batch(run.batch_id), BatchField.STOP, "expire")
            run.fields[BatchField.STOP] = cast(
                "str", await self.state.redis.hget(keys.batch(run.batch_id), BatchField.STOP)
            )

    async def _feed(self, runs: list[BatchRun]) -> None:
        """Admit lines one per owner in turn, each owner's batches in turn, until batch
        lines have no more room."""
        by_owner: dict[str, list[BatchRun]] = defaultdict(list)
        for run in runs:
            by_owner[run.owner].append(run)
        while by_owner:
            for owner in list(by_owner):
                queue = by_owner[owner]
                run = queue.pop(0)
                if not await batch_run.admit_next(self.state, run):
                    return
                if run.has_work():
                    queue.append(run)
                if not queue:
                    del by_owner[owner]
