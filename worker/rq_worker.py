"""tokenrelay's RQ worker: one process, the model loaded once (never forks), up to
`concurrency` jobs executing at once, and only allow-listed job functions.

RQ 3.0 tracks a set of executions per worker; `ConcurrentWorker` runs each dequeued job's
execution on a thread of its own (the job function hands the job to the batcher and waits;
the threads are kept between jobs, and one thread enforces every job's timeout: starting
two threads per job cost ~1 ms of its start), so
RQ's registries, `rq info` and the worker's state tell the truth while N jobs run. RQ's
record of a job's start (one transaction: `record_start`) is written once the job function
says the job started (`StartSignal`: after tokenrelay's START, with the job in the batch), so
a job's first token does not wait for it; if that write fails, it is tried again when the
function returns, and a job whose start never lands stays out of RQ's registries (its RQ key
expires with its queue-wait TTL). RQ internals relied on (pinned by `rq==3.0.0`, covered by
tests/test_rq_worker.py): `dequeue_job_and_maintain_ttl`, `dequeue_timeout`,
`check_for_suspension`, `get_heartbeat_ttl`, `Execution.create`, `Job.prepare_for_execution`,
`Result.create`, `Job.finished_job_registry`, `_finalize_success`, `_finalize_failure`,
`set_state`/`_state`, `last_heartbeat`, `request_stop`/`_stop_requested`, `teardown`,
`executions`, `BaseDeathPenalty`, `handle_execution_ended`, `handle_job_success`
(replaced: `_record_success`), `increment_successful_job_count`,
`increment_total_working_time`, `cleanup_execution`, `handle_job_failure`, `handle_exception`
(replaced for a client's mistake: one line, no traceback).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from queue import SimpleQueue
from typing import Any

import redis
from redis.typing import EncodableT, FieldT
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.utils import now, utcformat
from rq.worker import SimpleWorker, WorkerStatus

from tokenrelay.shared.errors import TokenrelayError
from tokenrelay.shared.redis.rq_jobs import worker_queues
from tokenrelay.worker.job_timeouts import WatchdogDeathPenalty
from tokenrelay.worker.retry import retry_until

log = logging.getLogger(__name__)

_SLOT_WAIT_S = 5.0
DEQUEUE_WAIT_S = 5
"""The longest one dequeue (BLPOP) blocks. RQ's default is `worker_ttl` - 15 s (405 s), and
RQ raises its connection's socket timeout to that plus 10 s: a primary that froze or was
cut off (it never closes the connection) kept a worker blocked there for 7 minutes while
the jobs queued on the new primary expired. With 5 s, the socket times out after 15 s and
RQ's retry reconnects, through the sentinels, to whichever server is the primary now."""
HEARTBEAT_EVERY_S = 1.0
"""RQ beats the worker's heartbeat (three commands) before and after every dequeue and in
its check for suspension: at many jobs a second, nine commands a job, three of them between
taking the job and starting it. Its key lives `worker_ttl` + 60 s (480 s), so
one beat a second at most is plenty; a beat RQ asks for with a timeout (a job's start, which
sets the key's TTL from the job's timeout) always goes through."""
SUSPENSION_CHECK_EVERY_S = 1.0
"""RQ checks whether workers are suspended (`rq suspend`: a transaction) before every
dequeue; once a second at most is soon enough to notice it."""
BOOKKEEPING_RETRY_S = 60.0
"""How long RQ's bookkeeping of a job that ended is retried while Redis is unreachable. A
job that ended as Redis went down kept its `rq:job:` key without a TTL, in RQ's started
registry, when the bookkeeping met the outage once and gave up."""
PUBSUB_POLL_S = 1.0
"""How often the thread reading RQ's command channel wakes (see `ConcurrentWorker.subscribe`)."""


class UnknownJobFunction(Exception):
    """A job named a function outside the worker's allow-list."""


def allow_listed_job_class(functions: Mapping[str, Callable[..., Any]]) -> type[Job]:
    """A `Job` class whose `func` resolves only the names in `functions`, never by import."""

    class AllowListedJob(Job):
        @property
        def func(self) -> Callable[..., Any]:
            name = self.func_name
            if name is None or name not in functions:
                raise UnknownJobFunction(f"job function {name!r} is not allowed on this worker")
            return functions[name]

    return AllowListedJob


class StartSignal:
    """Lets a job function tell its worker, on the job's thread, that the job started: RQ's
    record of the start is written then (`started`), after tokenrelay's START."""

    def __init__(self) -> None:
        self._local = threading.local()

    def expect(self, record_start: Callable[[], object] | None) -> None:
        """What `started` calls on this thread (None: nothing, once its job has ended)."""
        self._local.record_start = record_start

    def started(self) -> None:
        """Write RQ's record of this thread's job's start, once; a Redis error is left to
        the worker, which tries again when the job function returns."""
        record_start = getattr(self._local, "record_start", None)
        if record_start is None:
            return
        try:
            record_start()
        except redis.RedisError as exc:
            log.warning("RQ's record of a job's start failed, will retry at its end: %s", exc)


class _JobRun:
    """RQ's execution of one job, recorded once, on the job's thread."""

    def __init__(self, worker: ConcurrentWorker, job: Job) -> None:
        self._worker = worker
        self._job = job
        self._execution: Execution | None = None

    def record_start(self) -> Execution:
        if self._execution is None:
            self._execution = self._worker.record_start(self._job)
        return self._execution


class _AtMostEvery:
    """Says whether `period_s` passed since it last said yes."""

    def __init__(self, period_s: float) -> None:
        self._period_s = period_s
        self._last_s = float("-inf")

    def due(self) -> bool:
        now_s = time.monotonic()
        if now_s - self._last_s < self._period_s:
            return False
        self._last_s = now_s
        return True


class _JobThreads:
    """Daemon threads that run jobs, started as needed up to `limit` and kept between jobs
    (a thread started for each job cost ~0.3 ms of its start on a loaded 2-core box). Not
    `ThreadPoolExecutor`: its threads are joined at interpreter exit, so a job thread left
    waiting on a batcher that died would keep the worker process from exiting."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._work: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: list[threading.Thread] = []

    def run(self, work: Callable[[], None]) -> None:
        """Run `work` on an idle thread, else a new one (else, at the limit, on the first
        thread that finishes)."""
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._limit:
                name = f"job-{len(self._threads)}"
                thread = threading.Thread(target=self._serve, name=name, daemon=True)
                self._threads.append(thread)
                thread.start()
        self._work.put(work)

    def join(self) -> None:
        """Wait for the work given so far to end, and for the threads to exit."""
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                work()
            except Exception:
                log.exception("a job thread's work failed")
            with self._lock:
                self._idle += 1


class ConcurrentWorker(SimpleWorker):
    """Executes up to `concurrency` jobs at once, each on a job thread of its own.

    A slot is taken before dequeuing, so a full worker leaves jobs in Redis for other
    workers. On SIGTERM/SIGINT it stops dequeuing, calls `on_stop_requested` (which bounds
    the drain), and waits for its running jobs before it deregisters.
    """

    death_penalty_class = WatchdogDeathPenalty

    def __init__(
        self,
        *args: Any,
        concurrency: int,
        on_stop_requested: Callable[[], None],
        start_signal: StartSignal,
        **kwargs: Any,
    ) -> None:
        self._beats = _AtMostEvery(HEARTBEAT_EVERY_S)
        self._suspension_checks = _AtMostEvery(SUSPENSION_CHECK_EVERY_S)
        self._start_signal = start_signal
        self._state_lock = threading.Lock()
        self._starts_in_flight = 0
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(concurrency)
        self._job_threads = _JobThreads(concurrency)
        self._on_stop_requested = on_stop_requested
        self._dequeuing = False

    def subscribe(self) -> None:
        """RQ's command channel (`rq`'s kill-horse, stop-job), read by a thread that wakes
        every `PUBSUB_POLL_S`: RQ's own waits 60 s per read, and stopping the worker joins
        that thread, so a worker that unsubscribed before the thread's first read took up
        to a minute to stop."""
        self.log.debug("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ types it None
            sleep_time=PUBSUB_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if timeout is not None or self._beats.due():
            super().heartbeat(timeout, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        if self._suspension_checks.due():
            super().check_for_suspension(burst)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        while not self._slots.acquire(timeout=_SLOT_WAIT_S):
            self.heartbeat()
        if self._stop_requested:
            self._slots.release()
            raise StopRequested()
        self._dequeuing = True
        try:
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        except BaseException:
            self._slots.release()
            raise
        finally:
            self._dequeuing = False
        if result is None:
            self._slots.release()
        return result

    @property
    def dequeue_timeout(self) -> int:
        return DEQUEUE_WAIT_S

    def record_start(self, job: Job) -> Execution:
        """RQ's `prepare_execution` and `prepare_job_execution` in one transaction (each is
        one of its own, and both beat the worker's heartbeat): the job's execution in its
        registries, the worker busy and its key's TTL the job's (one HSET with the beat; the
        executions set's TTL is `Execution.create`'s), the job started (its heartbeat is
        `prepare_for_execution`'s) and without its queue-wait TTL. While it is in flight no
        other thread writes the worker idle."""
        with self._state_lock:
            self._starts_in_flight += 1
        try:
            with self.connection.pipeline() as pipe:
                ttl = self.get_heartbeat_ttl(job)
                execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
                self.last_heartbeat = now()
                beat: dict[FieldT, EncodableT] = {
                    "state": WorkerStatus.BUSY,
                    "last_heartbeat": utcformat(self.last_heartbeat),
                }
                pipe.hset(self.key, mapping=beat)
                pipe.expire(self.key, ttl)
                job.prepare_for_execution(self.name, pipeline=pipe)
                pipe.persist(job.key)
                if len(self.queues) == 1:
                    pipe.lrem(self.queues[0].intermediate_queue_key, 1, job.id)
                pipe.execute()
            with self._state_lock:
                self._state = WorkerStatus.BUSY
                self.executions[execution.id] = execution
            return execution
        finally:
            with self._state_lock:
                self._starts_in_flight -= 1

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._job_threads.run(lambda: self._perform(job, queue))

    def _perform(self, job: Job, queue: Queue) -> None:
        """RQ's `perform_job`, with its record of the start written when the job function
        signals it (`StartSignal`), or at the latest when the function returns."""
        run = _JobRun(self, job)
        self._start_signal.expect(run.record_start)
        try:
            try:
                job.started_at = now()
                timeout = job.timeout or self.queue_class.DEFAULT_TIMEOUT
                with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                    return_value = job.perform()
                self._finalize_success(job, queue, run.record_start(), return_value)
            except BaseException:
                exc_info = sys.exc_info()
                self._finalize_failure(job, queue, run.record_start(), exc_info)
        except redis.RedisError as exc:
            log.warning("RQ's bookkeeping of job %s failed: %s", job.id, exc)
        finally:
            self._start_signal.expect(None)
            self._slots.release()
            self.set_state(WorkerStatus.IDLE)  # a no-op while other jobs run

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """The job's end time only: RQ also beats the job's heartbeat here, a round trip that
        keeps it in the started registry through success and failure callbacks, which
        tokenrelay's jobs do not have; the transaction that follows ends it there."""
        job.ended_at = now()

    def handle_job_success(
        self, job: Job, queue: Queue, started_job_registry: Any, execution: Execution
    ) -> None:
        _until_redis_answers(lambda: self._record_success(job, execution))

    def _record_success(self, job: Job, execution: Execution) -> None:
        """RQ's `handle_job_success` for tokenrelay's jobs, which ADMIT enqueues without
        dependencies, dependents, repeats or a rate limit: its one transaction, without the
        WATCH and read of the job's dependents before it (two round trips), without
        expiring the dependents' keys, which do not exist, and writing the two fields of the
        job's hash that changed since its start (`Job._handle_success` writes them all,
        the request's payload included)."""
        assert job.started_at is not None and job.ended_at is not None
        result_ttl = job.get_result_ttl(self.default_result_ttl)
        with self.connection.pipeline() as pipe:
            self.increment_successful_job_count(pipeline=pipe)
            self.increment_total_working_time(job.ended_at - job.started_at, pipe)
            ended: dict[FieldT, EncodableT] = {
                "status": JobStatus.FINISHED,
                "ended_at": utcformat(job.ended_at),
            }
            pipe.hset(job.key, mapping=ended)
            Result.create(
                job,
                Result.Type.SUCCESSFUL,
                return_value=job._result,
                ttl=result_ttl,
                worker_name=self.name,
                pipeline=pipe,
                execution_id=execution.id,
                execution_started_at=execution.created_at,
                execution_ended_at=job.ended_at,
            )
            job.finished_job_registry.add(job, result_ttl, pipe)
            pipe.expire(job.key, result_ttl)
            self.cleanup_execution(job, pipeline=pipe, execution=execution)
            pipe.execute()

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """RQ logs a failed job at ERROR with its traceback. A job refused for what its
        request asks (a 4xx: a prompt over the context window, a schema it cannot follow) is
        the client's mistake, not the worker's: one INFO line with the job id instead. RQ
        still records the failure (`handle_job_failure`)."""
        error = exc_info[1] if len(exc_info) > 1 else None
        if isinstance(error, TokenrelayError) and error.status_code < 500:
            log.info("job %s refused: %s: %s", job.id, error.error_type, error.message)
            return
        super().handle_exception(job, *exc_info)

    def handle_job_failure(self, *args: Any, **kwargs: Any) -> None:
        _until_redis_answers(
            lambda: super(ConcurrentWorker, self).handle_job_failure(*args, **kwargs)
        )

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's, but idle only when no job runs or is being recorded as started, and no
        write of the state it holds (RQ sets it idle before every dequeue: a busy worker
        rewrote "busy" once a job). Job threads and the dequeuing thread both call it."""
        with self._state_lock:
            if state == WorkerStatus.IDLE and (self.executions or self._starts_in_flight):
                return
            if state != self._state:
                super().set_state(state, pipeline=pipeline)

    def request_stop(self, signum: Any, frame: Any) -> None:
        self._on_stop_requested()
        super().request_stop(signum, frame)
        if self._dequeuing:
            raise StopRequested()

    def teardown(self) -> None:
        self._job_threads.join()
        super().teardown()


def _until_redis_answers(bookkeeping: Callable[[], None]) -> None:
    """Run RQ's `bookkeeping` of an ended job, again (bounded backoff) after each connection
    error or timeout, for `BOOKKEEPING_RETRY_S` at most. Each step is one transaction, or
    idempotent: a rerun does not apply it twice."""
    retry_until(
        bookkeeping,
        give_up_at=time.monotonic() + BOOKKEEPING_RETRY_S,
        what="RQ's bookkeeping of a job",
        errors=(redis.ConnectionError, redis.TimeoutError),
    )


def build_worker(
    connection: redis.Redis,
    name: str,
    functions: Mapping[str, Callable[..., Any]],
    *,
    model: str,
    concurrency: int = 1,
    on_stop_requested: Callable[[], None] = lambda: None,
    start_signal: StartSignal | None = None,
) -> ConcurrentWorker:
    return ConcurrentWorker(
        worker_queues(connection, model, name),
        name=name,
        connection=connection,
        serializer=JSONSerializer,
        job_class=allow_listed_job_class(functions),
        log_job_description=False,  # RQ would log the call string, prompt included, at INFO
        concurrency=concurrency,
        on_stop_requested=on_stop_requested,
        start_signal=start_signal or StartSignal(),
    )
