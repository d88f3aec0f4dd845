"""Run one generation job on a job thread: take it over, hand it to the batcher, wait for
it to leave the batch, end it exactly once.

START and FINISH are retried with a bounded backoff through Redis errors: START for up to a
lease TTL (a resend after a lost reply finds the job running here), FINISH, with the job's
events its log still lacks, for as long as the job's lease holds, so a job whose generation
completed is finished, never reaped, while its worker lives. Where the token plane is a Redis
of its own, START is followed by OPEN there (the log's Started event) and FINISH preceded by
CLOSE (final event, text); each of these is a no-op when resent.

A job its earlier worker did not end (lost, or handed over on stop) starts here as a
continuation: START returns what its log delivered, and the job prefills it after the prompt
and generates the rest (`worker.continuation`). FINISH names this worker, so a worker that
was thought dead and comes back ends nothing of a job another worker now runs.

Across a Sentinel failover (`FailoverGuard`): a start or an end that would not survive it
is made again on the new primary (an end with the events that primary lacks), and a job
that ran here while the primary still holds it queued goes back to its queue; a job
dequeued twice runs once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from tokenrelay.shared.errors import (
    GenerationFailed,
    InvalidRequest,
    JobCancelled,
    TokenrelayError,
    WorkerLost,
)
from tokenrelay.shared.events import Done, Error, Started, Usage
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.jobs import JobField, JobStatus, error_fields
from tokenrelay.shared.redis import job_scripts, placement, plane_scripts, scripts
from tokenrelay.shared.redis.model_limits import ModelLimits
from tokenrelay.shared.redis.rq_jobs import READER_KEY
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.shared.truncation import truncate_oldest
from tokenrelay.worker.active_jobs import ActiveJobs, StopReason
from tokenrelay.worker.batcher import Batcher, BatchJob
from tokenrelay.worker.continuation import Delivered
from tokenrelay.worker.delivery import Courier, JobLog
from tokenrelay.worker.engines.protocol import Engine, SamplingParams
from tokenrelay.worker.failover_guard import FailoverGuard
from tokenrelay.worker.retry import Backoff, retry_until
from tokenrelay.worker.stop_strings import StopStringMatcher

log = logging.getLogger(__name__)

_WAIT_SLICE_S = 0.25
_TAKE_WAIT_S = 0.01
"""How long a job's thread, having handed its job to the batcher, waits for the batcher to
take it before it writes RQ's record of the start: building that transaction holds the
GIL, and the batcher, woken for the job, waited it out before the job's first step, which
delayed its first token (docs/benchmarks/gateway.md)."""


class _GivenBack(Exception):
    """The job ran here but is still queued on the primary, and went back to its queue."""


class JobRunner:
    """The RQ job function of a worker: `generate(job_id, request)` streams one job."""

    def __init__(
        self,
        engine: Engine,
        batcher: Batcher,
        redis_scripts: SyncScripts,
        settings: Settings,
        worker_name: str,
        active: ActiveJobs,
        guard: FailoverGuard,
        plane_scripts: SyncScripts | None = None,
        on_started: Callable[[], None] = lambda: None,
    ) -> None:
        """`plane_scripts` run on the token plane's own Redis (None: `redis_scripts`' is it);
        `on_started` runs on the job's thread once the job started and is in the batch (RQ's
        record of the start: `StartSignal.started`)."""
        self._engine = engine
        self._on_started = on_started
        self._batcher = batcher
        self._scripts = redis_scripts
        self._plane_scripts = plane_scripts or redis_scripts
        self._guard = guard
        self._settings = settings
        self._worker_name = worker_name
        self._active = active
        self._courier = Courier(self._plane_scripts, settings, active)

    def generate(self, job_id: str, request: dict[str, Any]) -> dict[str, str]:
        """Run the job (with the API process that reads its events, if the request names one:
        `rq_jobs.READER_KEY`); returns its terminal status. Raises if it failed (RQ marks it
        failed)."""
        parsed = GenerationRequest.model_validate(request)
        reader: str | None = request.get(READER_KEY)
        if parsed.prompt is not None:
            prompt_ids = self._engine.encode_prompt(parsed.prompt)
        elif parsed.truncating(self._settings.truncate_messages):
            budget = self._limits().tokens_per_job - parsed.max_tokens
            _, prompt_ids = truncate_oldest(
                parsed.messages,
                lambda kept: self._engine.encode_chat(kept, parsed.tools),
                lambda count: count <= budget,
            )
        else:
            prompt_ids = self._engine.encode_chat(parsed.messages, parsed.tools)
        started = Started(worker=self._worker_name, prompt_tokens=len(prompt_ids))
        if not self._active.add(job_id):
            log.warning("job %s dequeued again while it runs here; not started twice", job_id)
            return {"status": JobStatus.RUNNING}
        try:
            reply = self._start(job_id, started.to_wire(), self._prefix_index(prompt_ids))
            if reply.status != JobStatus.RUNNING:
                log.info("job %s not started: %s", job_id, reply.status)
                return {"status": str(reply.status)}
            return {"status": self._run_started(job_id, parsed, prompt_ids, reader, reply)}
        except _GivenBack:
            return {"status": JobStatus.QUEUED}
        finally:
            self._active.remove(job_id)

    def _prefix_index(self, prompt_ids: list[int]) -> list[scripts.Arg]:
        """START's arguments recording this worker as the holder of the prompt's blocks
        (`shared.redis.placement`): the hashes of the very ids it prefills."""
        settings = self._settings
        if settings.prefix_placement == "off":
            return []
        model = settings.model_id
        block_tokens = settings.prefix_placement_block_tokens
        blocks = placement.prompt_blocks(model, prompt_ids, block_tokens)
        return placement.index_args(settings, model, blocks)

    def _start(
        self, job_id: str, started_event: str, prefix_index: list[scripts.Arg]
    ) -> job_scripts.StartReply:
        call = job_scripts.start(
            self._settings, job_id, self._worker_name, started_event, prefix_index
        )
        open_log = None
        if not self._settings.token_plane_shared:
            open_log = plane_scripts.open_log(self._settings, job_id, started_event)
        give_up_at = time.monotonic() + self._settings.lease_ttl_s

        def start_once() -> tuple[job_scripts.StartReply, bool]:
            reply, holds = self._guard.apply(
                lambda client: job_scripts.parse_start(self._scripts.run(call, client)),
                lambda reply: reply.status == JobStatus.RUNNING,
            )
            if reply.status == JobStatus.RUNNING and open_log is not None:
                self._plane_scripts.run(open_log)
            return reply, holds

        backoff = Backoff()
        while True:
            sent_at = time.monotonic()
            reply, holds = retry_until(
                start_once, give_up_at=give_up_at, what=f"START of job {job_id}"
            )
            if reply.status == JobStatus.RUNNING:
                self._active.lease_renewed([job_id], sent_at, self._settings.lease_ttl_s)
            if not holds and time.monotonic() < give_up_at:
                log.warning("job %s started on a primary that failed over; again", job_id)
                backoff.sleep()
                continue  # on the new primary, which the process's clients now reach
            return reply

    def _run_started(
        self,
        job_id: str,
        request: GenerationRequest,
        prompt_ids: list[int],
        reader: str | None,
        reply: job_scripts.StartReply,
    ) -> str:
        channel = plane_scripts.reader_channel(self._settings, reader)
        fresh_log = JobLog(job_id, channel)
        job_log: JobLog | None = fresh_log
        try:
            delivered = None
            if reply.attempt > 1:
                delivered = Delivered.from_log(reply.delivered)
                fresh_log = job_log = delivered.job_log(job_id, channel)
                log.info(
                    "job %s continues here (attempt %d) after %d delivered tokens",
                    job_id,
                    reply.attempt,
                    len(delivered.token_ids),
                )
            self._check_fits(request, len(prompt_ids))
            job = self._batch_job(job_id, request, prompt_ids, fresh_log, delivered)
            self._batcher.submit(job)
            job_log = None  # the batcher's until the job leaves the batch
            job.taken.wait(_TAKE_WAIT_S)
            self._on_started()
            self._wait(job)
            job_log = job.log
            if job.error is not None:
                raise job.error
        except TokenrelayError as exc:
            self._fail(job_id, job_log, exc)
            raise
        except Exception as exc:
            log.exception("job %s failed", job_id)
            failure = GenerationFailed(f"generation failed: {type(exc).__name__}: {exc}")
            self._fail(job_id, job_log, failure)
            raise failure from exc
        return self._conclude(job, len(prompt_ids))

    def _batch_job(
        self,
        job_id: str,
        request: GenerationRequest,
        prompt_ids: list[int],
        job_log: JobLog,
        delivered: Delivered | None,
    ) -> BatchJob:
        """The job as the batcher runs it; a continuation prefills the delivered tokens after
        the prompt, generates only the rest, and counts them as completion tokens."""
        params = self._sampling(request)
        decoder = self._engine.new_decoder()
        matcher = StopStringMatcher(request.stop, include_stop=request.include_stop_str_in_output)
        if delivered is None:
            return BatchJob(job_id, prompt_ids, params, decoder, matcher, job_log)
        delivered.resume(decoder, matcher)
        return BatchJob(
            job_id,
            prompt_ids + list(delivered.token_ids),
            delivered.params(params, self._engine.continue_grammar),
            decoder,
            matcher,
            job_log,
            completion_tokens=len(delivered.token_ids),
        )

    @staticmethod
    def _wait(job: BatchJob) -> None:
        """Wait in slices, so RQ's job timeout can interrupt this thread."""
        try:
            while not job.done.wait(_WAIT_SLICE_S):
                pass
        finally:
            job.abandoned = not job.done.is_set()

    def _limits(self) -> ModelLimits:
        return ModelLimits(self._engine.max_context_tokens, self._settings.worker_max_batch_tokens)

    def _check_fits(self, request: GenerationRequest, prompt_tokens: int) -> None:
        self._limits().check_fits(prompt_tokens, request.max_tokens, "messages")

    def _sampling(self, request: GenerationRequest) -> SamplingParams:
        temperature, top_p, top_k = self._engine.sampling_defaults()
        vocab = self._engine.vocab_size
        for field, ids in (
            ("logit_bias", request.logit_bias),
            ("stop_token_ids", request.stop_token_ids),
        ):
            if outside := sorted(i for i in ids if i >= vocab):
                raise InvalidRequest(
                    f"`{field}` names token ids {outside[:5]} outside this model's vocabulary "
                    f"(ids 0 to {vocab - 1})",
                    param=field,
                )
        return SamplingParams(
            max_tokens=request.max_tokens,
            min_tokens=request.min_tokens,
            temperature=request.temperature if request.temperature is not None else temperature,
            top_p=request.top_p if request.top_p is not None else top_p,
            top_k=request.top_k if request.top_k is not None else top_k,
            seed=request.seed,
            frequency_penalty=request.frequency_penalty,
            presence_penalty=request.presence_penalty,
            repetition_penalty=request.repetition_penalty,
            logit_bias=tuple(sorted(request.logit_bias.items())),
            ignore_eos=request.ignore_eos,
            stop_token_ids=frozenset(request.stop_token_ids),
            logprobs=request.logprobs,
            grammar=None
            if request.json_schema is None
            # A forced call as this model's tool-call parser reads it: inside `<tool_call>`
            # tags, or the bare call object for the `json` parser.
            else self._engine.compile_grammar(
                request.json_schema,
                request.tool_call and self._settings.tool_call_parser != "json",
            ),
        )

    def _conclude(self, job: BatchJob, prompt_tokens: int) -> str:
        """FINISH the job; raises `WorkerLost` when it ends failed, or when another process
        (the reaper) had ended it, so RQ lists it as failed, like tokenrelay, never finished."""
        fields: dict[str, scripts.Arg] = {
            JobField.PROMPT_TOKENS: prompt_tokens,
            JobField.COMPLETION_TOKENS: job.completion_tokens,
        }
        reason = self._active.stop_reason(job.job_id)
        if job.finish_reason is None and reason == StopReason.SHUTDOWN and self._hand_over(job):
            return JobStatus.QUEUED
        if job.finish_reason is None and reason is not None:
            status, error = _STOPPED[reason]
            fields |= error_fields(error)
            if not self._finish(job.job_id, job.log, status, fields, error):
                raise self._lost(job.job_id)
            if status == JobStatus.FAILED:
                raise WorkerLost(error.message)
            return status
        finish_reason = job.finish_reason or "stop"
        cached_tokens = min(job.cached_tokens, prompt_tokens)
        fields[JobField.CACHED_TOKENS] = cached_tokens
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=job.completion_tokens,
            total_tokens=prompt_tokens + job.completion_tokens,
            cached_tokens=cached_tokens,
        )
        done = Done(finish_reason=finish_reason, usage=usage, stop_sequence=job.matcher.matched)
        fields[JobField.FINISH_REASON] = finish_reason
        if not self._finish(job.job_id, job.log, JobStatus.SUCCEEDED, fields, done):
            raise self._lost(job.job_id)
        return JobStatus.SUCCEEDED

    def _hand_over(self, job: BatchJob) -> bool:
        """Hand a job this stopping worker still runs back to the front of its queue, to
        continue on another worker, once Redis holds every event it generated (retried while
        its lease holds); whether it did (else the job ends as before: attempts used up, a
        token plane of its own, or Redis out of reach)."""
        if not self._settings.token_plane_shared:
            return False
        self._active.ending(job.job_id)
        backoff = Backoff()
        while not (self._courier.send([job.log]) and job.log.complete):
            if not self._active.lease_valid(job.job_id):
                return False
            backoff.sleep()
        try:
            handed = self._scripts.run(
                job_scripts.hand_over(self._settings, job.job_id, self._worker_name)
            )
        except RedisError as exc:
            log.warning("job %s could not be handed over: %s", job.job_id, exc)
            return False
        if handed == 1:
            log.info("job %s handed over to continue on another worker", job.job_id)
        return bool(handed == 1)

    @staticmethod
    def _lost(job_id: str) -> WorkerLost:
        """What this run of a job raises when Redis took nothing of its end: the reaper ended
        the job, or continued it elsewhere, once its lease ran out (a worker that was paused,
        say); its events past that point were refused."""
        log.warning("job %s was ended or continued elsewhere; this run of it is dropped", job_id)
        return WorkerLost(WorkerLost.LEASE_EXPIRED_MESSAGE)

    def _fail(self, job_id: str, job_log: JobLog | None, exc: TokenrelayError) -> None:
        error = Error(error_type=exc.error_type, message=exc.message)
        self._finish(job_id, job_log, JobStatus.FAILED, dict(error_fields(error)), error)

    def _finish(
        self,
        job_id: str,
        job_log: JobLog | None,
        status: JobStatus,
        fields: dict[str, scripts.Arg],
        event: Done | Error,
    ) -> bool:
        """Send what the job's log lacks, and FINISH, until Redis took both or the lease ran
        out (then the reaper ends the job): where one Redis holds both planes, FINISH carries
        those events itself (so a job's last chunk needs no EMIT call of its own); else EMIT
        sends them first. Without a log (the batcher may still hold it, after RQ's job
        timeout) FINISH alone, unchecked. True if this call ended the job."""
        final_seq, text = (-1, None) if job_log is None else (job_log.next_seq, job_log.text)
        carried = self._settings.token_plane_shared
        wire = event.to_wire()
        close_log = None
        if not carried:
            close_log = plane_scripts.close_log(self._settings, job_id, wire, final_seq, text)

        def finish_call() -> scripts.ScriptCall:
            worker = self._worker_name
            if not carried:
                return job_scripts.finish(self._settings, job_id, status, fields, "", worker=worker)
            unsent = [] if job_log is None else job_log.unacked()
            return job_scripts.finish(
                self._settings, job_id, status, fields, wire, final_seq, text, unsent, worker
            )

        backoff = Backoff()
        self._active.ending(job_id)
        while True:
            if carried or job_log is None or self._courier.send([job_log]):
                try:
                    outcome, holds = self._end(close_log, finish_call())
                except RedisError as exc:
                    log.warning("FINISH of job %s failed, will retry: %s", job_id, exc)
                else:
                    if not holds:
                        log.warning("job %s ended on a primary that failed over; again", job_id)
                    elif outcome == job_scripts.FINISH_QUEUED:
                        self._give_back(job_id)
                    if holds and outcome != job_scripts.FINISH_BEHIND:
                        return bool(outcome == 1)
                    if job_log is not None:
                        job_log.resend_all()
            if not self._active.lease_valid(job_id):
                log.warning("job %s: its lease ran out before Redis took its end", job_id)
                return False
            backoff.sleep()

    def _end(
        self, close_log: scripts.ScriptCall | None, finish: scripts.ScriptCall
    ) -> tuple[Any, bool]:
        """FINISH's reply, and whether it survives a failover (`FailoverGuard.apply`); on a
        token plane of its own, after CLOSE closed the job's log there (a crash between leaves
        a running job with a closed log and its text, which the reaper ends; never a succeeded
        job without its text). CLOSE's refusal is FINISH's reply."""
        if close_log is not None:
            closed = self._plane_scripts.run(close_log)
            if closed != 1:
                return closed, True
        return self._guard.apply(
            lambda client: self._scripts.run(finish, client), lambda outcome: bool(outcome == 1)
        )

    def _give_back(self, job_id: str) -> None:
        """Return a job that FINISH found still queued to its queue (retried through Redis
        errors for up to a lease TTL), then end this run of it: another run starts afresh."""
        listed = retry_until(
            lambda: self._guard.give_back(job_id),
            give_up_at=time.monotonic() + self._settings.lease_ttl_s,
            what=f"giving job {job_id} back to its queue",
        )
        log.warning(
            "job %s ran here but the primary still holds it queued (a failover discarded "
            "its start): %s",
            job_id,
            "given back to its queue" if listed else "its queue lists it",
        )
        raise _GivenBack(job_id)


_STOPPED: dict[StopReason, tuple[JobStatus, Error]] = {
    StopReason.CANCELLED: (
        JobStatus.CANCELLED,
        Error(error_type=JobCancelled.error_type, message="the job was cancelled while running"),
    ),
    StopReason.LEASE_LOST: (
        JobStatus.FAILED,
        Error(
            error_type=WorkerLost.error_type,
            message="the worker lost this job's lease (Redis unreachable for too long)",
        ),
    ),
    StopReason.SHUTDOWN: (
        JobStatus.FAILED,
        Error(
            error_type=WorkerLost.error_type,
            message="the worker shut down and its drain period ran out before the job finished",
        ),
    ),
}
