"""Run one generation job: take it over, decode, stream its events, end it exactly once."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from shared import scripts
from shared.errors import ContextLengthExceeded, GenerationFailed, TokenrelayError
from shared.events import Done, Error, Started, TokenChunk, Usage
from shared.generation import GenerationRequest
from shared.jobs import JobStatus
from shared.script_runner import SyncScripts
from shared.settings import Settings
from worker.active_jobs import ActiveJobs, StopReason
from worker.engine import Engine, SamplingParams
from worker.stop_strings import StopStringMatcher

log = logging.getLogger(__name__)


@dataclass
class _Progress:
    completion_tokens: int = 0
    unsent_tokens: int = 0
    hit_stop_string: bool = False


class JobRunner:
    """The RQ job function of a worker: `generate(job_id, request)` streams one job."""

    def __init__(
        self,
        engine: Engine,
        redis_scripts: SyncScripts,
        settings: Settings,
        worker_name: str,
        active: ActiveJobs,
    ) -> None:
        self._engine = engine
        self._scripts = redis_scripts
        self._settings = settings
        self._worker_name = worker_name
        self._active = active

    def generate(self, job_id: str, request: dict[str, Any]) -> dict[str, str]:
        """Run the job; returns its terminal status. Raises if it failed (RQ marks it failed)."""
        parsed = GenerationRequest.model_validate(request)
        prompt_ids = self._engine.encode_chat(parsed.messages)
        started = Started(worker=self._worker_name, prompt_tokens=len(prompt_ids))
        self._active.add(job_id)
        try:
            status = self._scripts.run(
                scripts.start(self._settings, job_id, self._worker_name, started.to_wire())
            )
            if status != JobStatus.RUNNING:
                log.info("job %s not started: %s", job_id, status)
                return {"status": str(status)}
            return {"status": self._run_started(job_id, parsed, prompt_ids)}
        finally:
            self._active.remove(job_id)

    def _run_started(self, job_id: str, request: GenerationRequest, prompt_ids: list[int]) -> str:
        try:
            self._check_context(request, len(prompt_ids))
            progress = self._decode(job_id, request, prompt_ids)
        except TokenrelayError as exc:
            self._fail(job_id, exc)
            raise
        except Exception as exc:
            log.exception("job %s failed", job_id)
            failure = GenerationFailed(f"generation failed: {type(exc).__name__}: {exc}")
            self._fail(job_id, failure)
            raise failure from exc
        return self._conclude(job_id, request, len(prompt_ids), progress)

    def _check_context(self, request: GenerationRequest, prompt_tokens: int) -> None:
        limit = self._engine.max_context_tokens
        if prompt_tokens + request.max_tokens > limit:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {limit} tokens; the request asks for "
                f"{prompt_tokens + request.max_tokens} ({prompt_tokens} in the messages, "
                f"{request.max_tokens} for the completion): shorten the messages or lower "
                "`max_tokens`",
                param="messages",
            )

    def _sampling(self, request: GenerationRequest) -> SamplingParams:
        temperature, top_p, top_k = self._engine.sampling_defaults()
        return SamplingParams(
            max_tokens=request.max_tokens,
            min_tokens=request.min_tokens,
            temperature=request.temperature if request.temperature is not None else temperature,
            top_p=request.top_p if request.top_p is not None else top_p,
            top_k=top_k,
            seed=request.seed,
        )

    def _decode(self, job_id: str, request: GenerationRequest, prompt_ids: list[int]) -> _Progress:
        decoder = self._engine.new_decoder()
        matcher = StopStringMatcher(request.stop)
        progress = _Progress()
        tokens = self._engine.generate(
            prompt_ids,
            self._sampling(request),
            lambda: self._active.stop_reason(job_id) is not None,
        )
        for token in tokens:
            progress.completion_tokens += 1
            progress.unsent_tokens += 1
            self._send(job_id, matcher.feed(decoder.step(token)), progress)
            if matcher.stopped:
                progress.hit_stop_string = True
                break
        self._send(job_id, matcher.flush(), progress)
        return progress

    def _send(self, job_id: str, text: str, progress: _Progress) -> None:
        if not text:
            return
        chunk = TokenChunk(text=text, tokens=progress.unsent_tokens)
        progress.unsent_tokens = 0
        stopped = self._scripts.run(scripts.emit(self._settings, [(job_id, chunk.to_wire(), text)]))
        if stopped:
            self._active.request_stop(job_id, StopReason.CANCELLED)

    def _conclude(
        self, job_id: str, request: GenerationRequest, prompt_tokens: int, progress: _Progress
    ) -> str:
        fields: dict[str, scripts.Arg] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": progress.completion_tokens,
        }
        reason = self._active.stop_reason(job_id)
        if reason is not None:
            status, error = _STOPPED[reason]
            self._finish(job_id, status, fields | _error_fields(error), error.to_wire())
            return status
        length_reached = progress.completion_tokens >= request.max_tokens
        finish_reason: Literal["stop", "length"] = (
            "length" if length_reached and not progress.hit_stop_string else "stop"
        )
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=progress.completion_tokens,
            total_tokens=prompt_tokens + progress.completion_tokens,
        )
        done = Done(finish_reason=finish_reason, usage=usage)
        fields["finish_reason"] = finish_reason
        self._finish(job_id, JobStatus.SUCCEEDED, fields, done.to_wire())
        return JobStatus.SUCCEEDED

    def _fail(self, job_id: str, exc: TokenrelayError) -> None:
        error = Error(error_type=exc.error_type, message=exc.message)
        self._finish(job_id, JobStatus.FAILED, _error_fields(error), error.to_wire())

    def _finish(
        self, job_id: str, status: JobStatus, fields: dict[str, scripts.Arg], event: str
    ) -> None:
        self._scripts.run(scripts.finish(self._settings, job_id, status, fields, event))


_STOPPED: dict[StopReason, tuple[JobStatus, Error]] = {
    StopReason.CANCELLED: (
        JobStatus.CANCELLED,
        Error(error_type="cancelled", message="the job was cancelled while running"),
    ),
    StopReason.LEASE_LOST: (
        JobStatus.FAILED,
        Error(
            error_type="worker_lost",
            message="the worker lost this job's lease (Redis unreachable for too long)",
        ),
    ),
    StopReason.SHUTDOWN: (
        JobStatus.FAILED,
        Error(
            error_type="worker_lost",
            message="the worker shut down and its drain period ran out before the job finished",
        ),
    ),
}


def _error_fields(error: Error) -> dict[str, scripts.Arg]:
    return {"error_type": error.error_type, "error_message": error.message}
