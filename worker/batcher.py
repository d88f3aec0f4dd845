"""The decoding loop of a worker: one thread drives the engine for every running job.

Job threads `submit` a `BatchJob` and wait on its `done` event. The loop admits waiting jobs
while the batch has room (jobs and tokens: prompt + `max_tokens` each, against
`TOKENRELAY_WORKER_MAX_BATCH_TOKENS`), drops stopped jobs (cancelled, lease lost, drain
over) before every step, runs one engine step, turns tokens into text (never splitting a
character, never leaking a stop string), numbers each job's events in its `JobLog` and sends
the unacknowledged events of all jobs to Redis in one script call; after a Redis error they
stay in the logs and the next try waits a bounded backoff (`worker.delivery`), while
decoding goes on. A job that leaves the batch hands its log to its runner, which sends the
rest with its FINISH. With `TOKENRELAY_FLUSH_INTERVAL_MS` > 0, the jobs' text is held and
sent on the worker's flush tick, once per that interval less `FLUSH_SLACK` (a job's first
chunk and its last are never held): every job's held tokens go out together, so fast jobs
send several tokens per event and the worker makes one EMIT call per tick, not one per job
and interval (jobs that started at different times would otherwise each be due at a
different step).

The engine is built on the batcher's thread, the only thread that runs it: torch's OpenMP
threads then form one pool. Built on another thread (the main one) and stepped here, the
process holds two pools, more OpenMP threads than cores, and libgomp then sleeps at the end
of every parallel region instead of spinning, and a lone decode step slows down
(docs/benchmarks/worker-throughput.md).

HOT PATH (docs/architecture.md, "The per-token path"): measure with
`python -m bench.worker_throughput` before and after changing it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from tokenrelay.shared.events import TokenChunk, TokenLogprob, TopLogprob
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.active_jobs import ActiveJobs
from tokenrelay.worker.delivery import Courier, JobLog
from tokenrelay.worker.engines.protocol import (
    Engine,
    IncrementalDecoder,
    Logprob,
    SamplingParams,
    TokenOutput,
)
from tokenrelay.worker.retry import Backoff
from tokenrelay.worker.stop_strings import StopStringMatcher

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5
FLUSH_SLACK = 0.1
"""The flush tick comes once this share of `TOKENRELAY_FLUSH_INTERVAL_MS` short of the
interval has passed since the last, so a stream whose steps come just under the interval
apart (20 tok/s against 50 ms, with a step's usual jitter) still sends every token as it
comes, instead of two tokens every other step."""


@dataclass(eq=False)
class BatchJob:
    """One job's state inside the batch; `taken` is set when the batcher's loop holds it,
    `done` when it leaves the batch."""

    job_id: str
    prompt_ids: list[int]
    params: SamplingParams
    decoder: IncrementalDecoder
    matcher: StopStringMatcher
    log: JobLog
    completion_tokens: int = 0
    #: Prompt tokens the engine took from its prefix cache (`TokenOutput.cached_tokens`).
    cached_tokens: int = 0
    unsent_tokens: int = 0
    unsent_ids: list[int] = field(default_factory=list)
    unsent_text: str = ""
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] | None = None
    error: Exception | None = None
    abandoned: bool = False
    taken: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def budget_tokens(self) -> int:
        return len(self.prompt_ids) + self.params.max_tokens


class Batcher:
    def __init__(
        self,
        build_engine: Callable[[], Engine],
        plane_scripts: SyncScripts,
        settings: Settings,
        active: ActiveJobs,
        arrivals: threading.Event | None = None,
    ) -> None:
        """`build_engine` runs on the batcher's thread (`start`); `plane_scripts` run on the
        token plane's Redis (EMIT); `arrivals` is set whenever a job is submitted, for an
        engine that waits between steps (the synthetic one)."""
        self._build_engine = build_engine
        self._arrivals = arrivals or threading.Event()
        self._engine: Engine
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self._courier = Courier(plane_scripts, settings, active)
        self._backoff = Backoff()
        self._settings = settings
        self._active = active
        self._inbox: queue.Queue[BatchJob] = queue.Queue()
        self._waiting: deque[BatchJob] = deque()
        self._running: dict[str, BatchJob] = {}
        self._used_tokens = 0
        self._ticked_s = float("-inf")  # the last flush tick (`_publish`)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batcher", daemon=True)

    def start(self) -> Engine:
        """Build the engine on the batcher's thread, then decode there; returns the engine,
        or raises what building it raised."""
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error
        return self._engine

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def submit(self, job: BatchJob) -> None:
        self._inbox.put(job)
        self._arrivals.set()

    def _run(self) -> None:
        try:
            self._engine = self._build_engine()
        except BaseException as exc:
            self._build_error = exc
            return
        finally:
            self._built.set()
        self._loop()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._take_new(block=not self._running and not self._waiting)
            self._drop_stopped()
            self._admit_waiting()
            if not self._running:
                continue
            try:
                outputs = self._engine.step()
            except Exception as exc:
                log.exception(
                    "engine step failed; failing the %d jobs in the batch", len(self._running)
                )
                for job in list(self._running.values()):
                    job.error = exc
                    self._engine.remove(job.job_id)
                    self._end(job)
                continue
            self._publish(outputs)

    def _take_new(self, block: bool) -> None:
        try:
            job = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            job.taken.set()
            self._waiting.append(job)
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _stopped(self, job: BatchJob) -> bool:
        return job.abandoned or self._active.stop_reason(job.job_id) is not None

    def _drop_stopped(self) -> None:
        for job in [j for j in self._running.values() if self._stopped(j)]:
            self._engine.remove(job.job_id)
            if job.unsent_tokens:  # held by coalescing: its text and usage must agree
                self._add_chunk(job)
            self._end(job)
        for job in [j for j in self._waiting if self._stopped(j)]:
            self._waiting.remove(job)
            job.done.set()

    def _admit_waiting(self) -> None:
        limit_tokens = self._settings.worker_max_batch_tokens
        while self._waiting and len(self._running) < self._settings.worker_concurrency:
            job = self._waiting[0]
            if self._running and self._used_tokens + job.budget_tokens > limit_tokens:
                return
            self._waiting.popleft()
            self._engine.add(job.job_id, job.prompt_ids, job.params)
            self._running[job.job_id] = job
            self._used_tokens += job.budget_tokens

    def _publish(self, outputs: list[TokenOutput]) -> None:
        ended: list[BatchJob] = []
        now = time.monotonic()
        tick = now - self._ticked_s >= (1 - FLUSH_SLACK) * self._settings.flush_interval_ms / 1000
        if tick:
            self._ticked_s = now
        for output in outputs:
            job = self._running.get(output.seq_id)
            if job is None:
                continue
            text = ""
            job.cached_tokens += output.cached_tokens
            if output.token_id is not None:
                job.completion_tokens += 1
                job.unsent_tokens += 1
                job.unsent_ids.append(output.token_id)
                text = job.matcher.feed(job.decoder.step(output.token_id))
                if output.logprob is not None:
                    job.unsent_logprobs.append(self._logprob(output.token_id, output.logprob))
            if job.matcher.stopped:
                job.finish_reason = "stop"
                if output.finish_reason is None:
                    self._engine.remove(job.job_id)
            elif output.finish_reason is not None:
                job.finish_reason = output.finish_reason
                text += job.matcher.flush()
            job.unsent_text += text
            last = job.finish_reason is not None
            # The first chunk and the last are never held. The last also carries tokens that
            # decoded to no text, so the events count every completion token.
            first = not job.log.events
            if (self._pending(job) and (first or last)) or (last and job.unsent_tokens):
                self._add_chunk(job)
            if last:
                ended.append(job)
        if tick:  # every job's held tokens, whether or not this step decoded a token of it
            for job in self._running.values():
                if self._pending(job):
                    self._add_chunk(job)
        self._send(leaving=ended)
        for job in ended:
            self._end(job)

    @staticmethod
    def _pending(job: BatchJob) -> bool:
        return bool(job.unsent_text or job.unsent_logprobs)

    @staticmethod
    def _add_chunk(job: BatchJob) -> None:
        """Number the job's unsent tokens as one chunk event in its log."""
        chunk = TokenChunk(
            text=job.unsent_text,
            tokens=job.unsent_tokens,
            token_ids=job.unsent_ids,
            logprobs=job.unsent_logprobs if job.params.logprobs is not None else None,
        )
        job.log.add(chunk.to_wire(), job.unsent_text)
        job.unsent_text, job.unsent_tokens, job.unsent_ids = "", 0, []
        job.unsent_logprobs = []

    def _logprob(self, token_id: int, logprob: Logprob) -> TokenLogprob:
        value, top = logprob
        return TokenLogprob(
            **self._candidate(token_id, value).model_dump(),
            top_logprobs=[self._candidate(i, lp) for i, lp in top],
        )

    def _candidate(self, token_id: int, logprob: float) -> TopLogprob:
        raw = self._engine.token_bytes(token_id)
        return TopLogprob(token=raw.decode(errors="replace"), bytes=list(raw), logprob=logprob)

    def _send(self, leaving: list[BatchJob]) -> None:
        """Send the unacknowledged events of the running jobs; where one Redis holds both
        planes, not those of the jobs `leaving` the batch, whose FINISH carries them."""
        held = leaving if self._settings.token_plane_shared else []
        logs = [
            job.log for job in self._running.values() if not job.log.complete and job not in held
        ]
        if not logs or not self._backoff.ready():
            return
        if self._courier.send(logs):
            self._backoff.succeeded()
        else:
            self._backoff.failed()

    def _end(self, job: BatchJob) -> None:
        del self._running[job.job_id]
        self._used_tokens -= job.budget_tokens
        job.done.set()
