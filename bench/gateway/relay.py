"""Relay-only mode of `bench.gateway`: API processes and Redis, no worker process.

`LockstepPublisher` plays the workers' part as a batched engine does: every 1/rate seconds
one decoding step, whose events (one token for every running job) go to Redis in EMIT calls
of up to `batch_jobs` jobs each, through tokenrelay's own scripts
(`tokenrelay.shared.redis.scripts`: ADMIT, START, EMIT, FINISH, RENEW). Clients stream
`GET /v1/jobs/{id}/events`. This measures what one API process costs per forwarded token,
and what Redis costs per token with full step batches, without a co-located worker (and RQ)
taking this machine's CPU: in production the workers run on the GPU hosts. The synthetic
engine does not batch this way (each job keeps its own clock, so one EMIT call carries only
the few jobs due in a ~2 ms slice).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import redis.asyncio

from tokenrelay.api.deps import ANONYMOUS
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.jobs import JobStatus
from tokenrelay.shared.redis import job_scripts, plane_scripts, scripts
from tokenrelay.shared.redis.scripts import AsyncScripts
from tokenrelay.shared.settings import Settings

WORKER_NAME = "bench-lockstep-publisher"
_WORD = "lorem "
_TOKEN_EVENT = TokenChunk(text=_WORD, tokens=1).to_wire()


class LockstepPublisher:
    def __init__(
        self,
        client: redis.asyncio.Redis,
        settings: Settings,
        tokens_per_job: int,
        interval_s: float,
        batch_jobs: int,
    ) -> None:
        self._scripts = AsyncScripts(client)
        self._settings = settings
        self._tokens_per_job = tokens_per_job
        self._interval_s = interval_s
        self._batch_jobs = batch_jobs
        self._remaining: dict[str, int] = {}
        self.late_steps = 0
        self.steps = 0

    async def new_job(self) -> str:
        """Admit and start a job as the API and a worker would; it gets a token every step."""
        job_id = uuid.uuid4().hex
        settings = self._settings
        admit = job_scripts.admit(settings, job_id, ANONYMOUS, settings.model_id)
        job_scripts.check_admitted(await self._scripts.run(admit))
        started = Started(worker=WORKER_NAME, prompt_tokens=1).to_wire()
        await self._scripts.run(job_scripts.start(settings, job_id, WORKER_NAME, started))
        self._remaining[job_id] = self._tokens_per_job
        return job_id

    async def run(self) -> None:
        """Decoding steps every `interval_s`; a late step is not made up by a burst."""
        next_step = time.perf_counter()
        next_renew = next_step + self._settings.lease_ttl_s / 3
        while True:
            next_step += self._interval_s
            delay = next_step - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.late_steps += 1
                next_step = time.perf_counter()
            await self._step()
            if time.perf_counter() > next_renew and self._remaining:
                renew = job_scripts.renew(self._settings, list(self._remaining))
                await self._scripts.run(renew)
                next_renew = time.perf_counter() + self._settings.lease_ttl_s / 3

    async def _step(self) -> None:
        self.steps += 1
        job_ids = list(self._remaining)
        for offset in range(0, len(job_ids), self._batch_jobs):
            batch = job_ids[offset : offset + self._batch_jobs]
            events = [
                (job_id, 1 + self._tokens_per_job - self._remaining[job_id], _TOKEN_EVENT)
                for job_id in batch
            ]
            await self._scripts.run(plane_scripts.emit(self._settings, events))
        ended = []
        for job_id in job_ids:
            self._remaining[job_id] -= 1
            if not self._remaining[job_id]:
                del self._remaining[job_id]
                ended.append(job_id)
        await asyncio.gather(*(self._finish(job_id) for job_id in ended))

    async def _finish(self, job_id: str) -> None:
        tokens = self._tokens_per_job
        usage = Usage(prompt_tokens=1, completion_tokens=tokens, total_tokens=1 + tokens)
        done = Done(finish_reason="length", usage=usage).to_wire()
        fields: dict[str, scripts.Arg] = {
            "prompt_tokens": 1,
            "completion_tokens": tokens,
            "finish_reason": "length",
        }
        call = job_scripts.finish(self._settings, job_id, JobStatus.SUCCEEDED, fields, done)
        await self._scripts.run(call)
