"""The RQ glue: JSON jobs, and a worker that only runs allow-listed job functions."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue, Worker
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.suspension import resume, suspend

from tokenrelay.shared.errors import ContextLengthExceeded, InvalidRequest, Overloaded
from tokenrelay.shared.generation import ChatMessage, GenerationRequest
from tokenrelay.shared.redis import job_scripts, keys
from tokenrelay.shared.redis.rq_jobs import (
    GENERATE_FUNCTION,
    READER_KEY,
    Priority,
    generation_queue,
    job_description,
    queued_job,
)
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.rq_worker import (
    DEQUEUE_WAIT_S,
    ConcurrentWorker,
    StartSignal,
    UnknownJobFunction,
    allow_listed_job_class,
    build_worker,
)


def test_a_job_naming_another_function_is_refused(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    queue = Queue(
        keys.generation_queue("m", "normal"), connection=connection, serializer=JSONSerializer
    )
    job = queue.enqueue_call("os.system", args=("echo pwned",))
    job_class = allow_listed_job_class({GENERATE_FUNCTION: lambda **_: None})
    fetched = job_class.fetch(job.id, connection=connection, serializer=JSONSerializer)
    with pytest.raises(UnknownJobFunction):
        _ = fetched.func
    connection.close()


def test_enqueued_generation_runs_the_allow_listed_function_with_json_kwargs(
    redis_url: str,
) -> None:
    connection = redis.Redis.from_url(redis_url)
    request = GenerationRequest(
        model="m", messages=(ChatMessage(role="user", content="你好"),), max_tokens=3
    )
    _admit_and_enqueue(connection, Settings(redis_url=redis_url), "job1", request)
    raw = connection.hget("rq:job:job1", "data")
    assert raw is not None and b"pickle" not in raw
    calls: list[dict[str, object]] = []

    def generate(job_id: str, request: dict[str, object]) -> dict[str, str]:
        calls.append({"job_id": job_id, "request": request})
        return {"status": "succeeded"}

    worker = build_worker(connection, "test-worker", {GENERATE_FUNCTION: generate}, model="m")
    worker.work(burst=True)
    assert calls == [{"job_id": "job1", "request": request.model_dump(mode="json")}]
    connection.close()


def test_a_jobs_reader_rides_in_its_request_which_a_worker_from_before_reads_unchanged(
    redis_url: str,
) -> None:
    """The API process reading a job is named inside the request's payload, not as an
    argument a worker from before reader channels would refuse: such a worker's
    `GenerationRequest.model_validate` reads the same request (and publishes per job)."""
    connection = redis.Redis.from_url(redis_url)
    request = GenerationRequest(
        model="m", messages=(ChatMessage(role="user", content="hi"),), max_tokens=3
    )
    entry = queued_job(connection, Settings(redis_url=redis_url), "r1", request, reader="api-7")
    admit = job_scripts.admit(Settings(redis_url=redis_url), "r1", "o", "m", enqueue=entry)
    job_scripts.check_admitted(SyncScripts(connection).run(admit))
    calls: list[dict[str, object]] = []

    def generate_before_reader_channels(job_id: str, request: dict[str, object]) -> dict[str, str]:
        calls.append(request)
        return {"status": "succeeded"}

    worker = build_worker(
        connection, "old-worker", {GENERATE_FUNCTION: generate_before_reader_channels}, model="m"
    )
    worker.work(burst=True)
    assert calls == [{**request.model_dump(mode="json"), READER_KEY: "api-7"}]
    assert GenerationRequest.model_validate(calls[0]) == request
    connection.close()


_PER_JOB_FIELDS = {"created_at", "enqueued_at", "data", "description"}


def _admit_and_enqueue(
    connection: redis.Redis,
    settings: Settings,
    job_id: str,
    request: GenerationRequest,
    priority: Priority = "normal",
) -> None:
    """As the API admits a job: ADMIT with its queue entry (`rq_jobs.queued_job`)."""
    entry = queued_job(connection, settings, job_id, request, priority)
    admit = job_scripts.admit(settings, job_id, "o", request.model, enqueue=entry)
    job_scripts.check_admitted(SyncScripts(connection).run(admit))


def test_admission_enqueues_what_rqs_enqueue_call_writes(redis_url: str) -> None:
    """ADMIT writes an admitted job's queue entry in the same script (`rq_jobs.queued_job`):
    the same job hash, TTL, queue entry and queue set as RQ's `enqueue_call`."""
    connection = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url)
    request = GenerationRequest(
        model="m", messages=(ChatMessage(role="user", content="hi"),), max_tokens=3
    )
    queue = generation_queue(connection, "m", "high")
    rq_job = queue.enqueue_call(
        GENERATE_FUNCTION,
        kwargs={"job_id": "by-rq", "request": request.model_dump(mode="json")},
        job_id="by-rq",
        description=job_description("by-rq"),
        timeout=settings.job_timeout_s,
        ttl=max(1, int(settings.max_queue_wait_s) + 1),
        result_ttl=settings.result_ttl_s,
        failure_ttl=settings.result_ttl_s,
    )
    ours_key = "rq:job:ours"
    _admit_and_enqueue(connection, settings, "ours", request, "high")
    theirs, ours = connection.hgetall(rq_job.key), connection.hgetall(ours_key)
    assert set(ours) == set(theirs)
    for field in set(ours) - {f.encode() for f in _PER_JOB_FIELDS}:
        assert ours[field] == theirs[field], field
    assert 0 < connection.ttl(ours_key) <= connection.ttl(rq_job.key) + 1
    assert connection.lrange(queue.key, 0, -1) == [b"by-rq", b"ours"]
    assert queue.key.encode() in connection.smembers("rq:queues")
    fetched = Queue(queue.name, connection=connection, serializer=JSONSerializer).jobs
    assert [job.id for job in fetched] == ["by-rq", "ours"]
    assert fetched[1].kwargs == {"job_id": "ours", "request": request.model_dump(mode="json")}
    assert fetched[1].get_status() == "queued"
    connection.close()


def test_a_refused_admission_enqueues_nothing_and_an_admitted_one_gets_its_fields(
    redis_url: str,
) -> None:
    connection = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, max_inflight=1)
    request = GenerationRequest(
        model="m", messages=(ChatMessage(role="user", content="hi"),), max_tokens=3
    )
    run = SyncScripts(connection)
    admitted = job_scripts.admit(
        settings,
        "in",
        "o",
        "m",
        enqueue=queued_job(connection, settings, "in", request),
        job_fields={"webhook": "https://example.com/h", "webhook_events": "completed"},
    )
    job_scripts.check_admitted(run.run(admitted))
    refused = job_scripts.admit(
        settings, "out", "o", "m", enqueue=queued_job(connection, settings, "out", request)
    )
    with pytest.raises(Overloaded):
        job_scripts.check_admitted(run.run(refused))
    assert generation_queue(connection, "m", "normal").job_ids == ["in"]
    assert not connection.exists("rq:job:out")
    assert connection.hget(keys.job("in"), "webhook_events") == b"completed"
    connection.close()


def test_rq_records_a_jobs_start_when_the_job_function_signals_it(redis_url: str) -> None:
    """tokenrelay's START comes first (the job's first token does not wait for RQ's two
    transactions), then RQ's record of the start; the job still ends in RQ's registries."""
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": "a"}, job_id="a")
    start_signal = StartSignal()
    seen: list[tuple[str, int]] = []
    worker_ttls: list[int] = []

    def rq_view() -> tuple[str, int]:
        job = Job.fetch("a", connection=connection, serializer=JSONSerializer)
        worker_ttls.append(int(connection.ttl(worker.key)))
        return job.get_status().value, StartedJobRegistry(queue=queue).count

    def generate(job_id: str) -> dict[str, str]:
        seen.append(rq_view())
        start_signal.started()
        seen.append(rq_view())
        start_signal.started()  # once only
        return {"status": "succeeded"}

    worker = build_worker(
        connection, "signalled", {GENERATE_FUNCTION: generate}, model="m", start_signal=start_signal
    )
    worker.work(burst=True)
    assert seen == [("queued", 0), ("started", 1)]
    # the start beats the worker's key with the job's heartbeat TTL, as RQ's start does
    job_ttl = worker.get_heartbeat_ttl(Job.fetch("a", connection=connection))
    assert job_ttl - 5 < worker_ttls[1] <= job_ttl < worker_ttls[0]
    assert FinishedJobRegistry(queue=queue).get_job_ids(cleanup=False) == ["a"]
    assert StartedJobRegistry(queue=queue).count == 0
    connection.close()


def _rq_commands_of_a_burst(redis_url: str, name: str, jobs: int) -> Counter[str]:
    """The commands a worker `name` sends to run `jobs` queued jobs in burst mode."""
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    for i in range(jobs):
        queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": f"{name}{i}"}, job_id=f"{name}{i}")
    start_signal = StartSignal()

    def generate(job_id: str) -> dict[str, str]:
        start_signal.started()
        return {"status": "succeeded"}

    worker = build_worker(
        connection, name, {GENERATE_FUNCTION: generate}, model="m", start_signal=start_signal
    )
    connection.config_resetstat()
    worker.work(burst=True)
    stats = connection.info("commandstats")
    connection.close()
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


def test_rq_runs_a_job_in_two_transactions_and_writes_each_state_once(redis_url: str) -> None:
    """Per job: the start (RQ's two start transactions in one) and the end (without RQ's
    round trips for dependents); the check for suspension once a second, RQ's heartbeat
    after the job function not sent, and a busy worker does not write its state again for
    every job."""
    one, four = (_rq_commands_of_a_burst(redis_url, f"w{n}", n) for n in (1, 4))
    per_job = {name: (four[name] - one[name]) / 3 for name in four | one}
    assert per_job["exec"] == 2
    assert per_job.get("watch", 0) == 0  # no dependents to move: no WATCH and read first
    # In burst mode RQ LPOPs each queue in turn, the worker's own before its model's (a
    # working worker's BLPOP names them all in one command): two more per job since each
    # worker has queues of its own (placement by prefix), left out of the earlier bound.
    assert per_job["lpop"] == 4
    assert sum(per_job.values()) - per_job["lpop"] <= 28, per_job  # 47.7, 37.7, 33.7 before


def test_a_suspended_worker_still_takes_no_job(redis_url: str) -> None:
    """`rq suspend` is checked once a second at most, and at the loop's first turn."""
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": "s"}, job_id="s")
    ran: list[str] = []
    suspend(connection)
    worker = build_worker(
        connection, "suspended", {GENERATE_FUNCTION: lambda job_id: ran.append(job_id)}, model="m"
    )
    worker.work(burst=True)
    assert ran == []
    assert queue.job_ids == ["s"]
    resume(connection)
    connection.close()


def test_a_dequeue_blocks_briefly_and_its_socket_times_out_soon_after(redis_url: str) -> None:
    """RQ blocks in BLPOP for `dequeue_timeout` and sets its connection's socket timeout to
    that + 10 s: a hung primary holds the worker that long, not RQ's default 415 s."""
    connection = redis.Redis.from_url(redis_url, socket_timeout=DEQUEUE_WAIT_S + 10.0)
    worker = build_worker(connection, "test-worker", {}, model="m")
    assert worker.dequeue_timeout == DEQUEUE_WAIT_S
    assert connection.connection_pool.connection_kwargs["socket_timeout"] == DEQUEUE_WAIT_S + 10
    connection.close()


def test_one_worker_executes_n_jobs_at_once_and_rq_tells_the_truth(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    for i in range(5):
        queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": f"ok{i}"}, job_id=f"ok{i}")
    queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": "boom"}, job_id="boom")
    release = threading.Event()
    seen: dict[str, object] = {}
    start_signal = StartSignal()

    def generate(job_id: str) -> dict[str, str]:
        if job_id == "boom":  # fails before it signals its start: RQ records it at its end
            raise RuntimeError("boom")
        start_signal.started()  # as `JobRunner` does once the job is in the batch
        assert release.wait(20)
        return {"status": "succeeded"}

    def observe() -> None:
        watcher = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            workers = Worker.all(connection=watcher, serializer=JSONSerializer)
            if workers and len(workers[0].get_current_executions(refresh=True)) == 3:
                seen["state"] = workers[0].get_state()
                seen["started"] = StartedJobRegistry(
                    queue=generation_queue(watcher, "m", "normal")
                ).count
                seen["rq_info"] = subprocess.run(
                    [
                        str(Path(sys.executable).parent / "rq"),
                        "info",
                        "--url",
                        redis_url,
                        "-S",
                        "rq.serializers.JSONSerializer",
                        "-W",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout
                break
            time.sleep(0.02)
        release.set()
        watcher.close()

    observer = threading.Thread(target=observe)
    observer.start()
    worker = build_worker(
        connection,
        "concurrent",
        {GENERATE_FUNCTION: generate},
        model="m",
        concurrency=3,
        start_signal=start_signal,
    )
    worker.work(burst=True)
    observer.join(timeout=30)
    assert seen["state"] == "busy"
    assert seen["started"] == 3
    assert "concurrent" in str(seen["rq_info"]) and "busy" in str(seen["rq_info"])
    finished = FinishedJobRegistry(queue=queue).get_job_ids(cleanup=False)
    assert sorted(finished) == [f"ok{i}" for i in range(5)]
    assert FailedJobRegistry(queue=queue).get_job_ids(cleanup=False) == ["boom"]
    assert StartedJobRegistry(queue=queue).count == 0
    connection.close()


def test_a_worker_is_not_written_idle_while_a_jobs_start_is_being_recorded(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dequeuing thread sets the worker idle before each dequeue; a job thread recording
    its start at that moment (its transaction landed, its execution not yet counted) keeps
    it busy. CI once saw 3 jobs running under an idle worker."""
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    job = queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": "j"}, job_id="j")
    worker = build_worker(connection, "racing", {}, model="m")
    worker.set_state("idle")
    landed, go_on = threading.Event(), threading.Event()
    execute = redis.client.Pipeline.execute

    def execute_then_hold(self: redis.client.Pipeline, *args: Any, **kw: Any) -> Any:
        result = execute(self, *args, **kw)
        if threading.current_thread().name == "job-j":
            landed.set()
            assert go_on.wait(10)
        return result

    monkeypatch.setattr(redis.client.Pipeline, "execute", execute_then_hold)
    recording = threading.Thread(target=worker.record_start, args=(job,), name="job-j")
    recording.start()
    assert landed.wait(10)
    worker.set_state("idle")
    go_on.set()
    recording.join(10)
    assert connection.hget(worker.key, "state") == b"busy"
    assert worker.get_state() == "busy"
    connection.close()


def test_bookkeeping_that_meets_a_redis_outage_is_retried_until_it_lands(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ's bookkeeping of an ended job that meets connection errors (Redis restarting) runs
    again: the job lands in RQ's finished registry with its key's TTL, not left started."""
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": "j"}, job_id="j")
    refusals = {"_record_success": 2}
    for name in refusals:
        original = getattr(ConcurrentWorker, name)

        def refusing(
            self: ConcurrentWorker,
            *args: object,
            _name: str = name,
            _call: Any = original,
            **kw: Any,
        ) -> object:
            if refusals[_name]:
                refusals[_name] -= 1
                raise redis.ConnectionError("Connection refused")
            return _call(self, *args, **kw)

        monkeypatch.setattr(ConcurrentWorker, name, refusing)
    worker = build_worker(
        connection, "retrying", {GENERATE_FUNCTION: lambda job_id: {"status": "ok"}}, model="m"
    )
    worker.work(burst=True)
    assert refusals == {"_record_success": 0}
    assert FinishedJobRegistry(queue=queue).get_job_ids(cleanup=False) == ["j"]
    assert StartedJobRegistry(queue=queue).count == 0
    assert connection.ttl("rq:job:j") > 0
    job = Job.fetch("j", connection=connection, serializer=JSONSerializer)
    assert job.get_status() == "finished"
    assert job.started_at is not None and job.ended_at is not None
    assert job.started_at <= job.ended_at and job.worker_name == worker.name
    assert job.kwargs == {"job_id": "j"}  # the request's payload as enqueued
    result = job.latest_result()
    assert result is not None and result.return_value == {"status": "ok"}
    assert connection.hget(worker.key, "successful_job_count") == b"1"
    connection.close()


def test_the_worker_beats_its_heartbeat_at_most_once_a_second_unless_asked_with_a_timeout(
    redis_url: str,
) -> None:
    """RQ beats before and after every dequeue; at many jobs a second that was six commands a
    job. The worker's key still lives far longer than a second between beats."""
    connection = redis.Redis.from_url(redis_url)
    worker = build_worker(connection, "beating", {}, model="m")
    before = connection.info("commandstats").get("cmdstat_hset", {"calls": 0})["calls"]
    for _ in range(6):
        worker.heartbeat()
    after = connection.info("commandstats")["cmdstat_hset"]["calls"]
    with connection.pipeline() as pipe:  # as RQ's check for suspension beats
        worker.heartbeat(pipeline=pipe)
        pipe.execute()
    after = connection.info("commandstats")["cmdstat_hset"]["calls"]
    assert after - before == 1
    assert connection.ttl(worker.key) > 60
    worker.heartbeat(timeout=30)
    assert 0 < connection.ttl(worker.key) <= 30
    connection.close()


def test_jobs_run_on_threads_kept_between_jobs_up_to_the_concurrency(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    for i in range(6):
        queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": f"j{i}"}, job_id=f"j{i}")
    threads: list[str] = []

    def generate(job_id: str) -> dict[str, str]:
        threads.append(threading.current_thread().name)
        return {"status": "succeeded"}

    worker = build_worker(
        connection, "pooled", {GENERATE_FUNCTION: generate}, model="m", concurrency=2
    )
    worker.work(burst=True)
    assert len(threads) == 6
    assert 1 <= len(set(threads)) <= 2
    assert sorted(FinishedJobRegistry(queue=queue).get_job_ids(cleanup=False)) == [
        f"j{i}" for i in range(6)
    ]
    connection.close()


def test_a_job_past_its_timeout_fails_with_rqs_timeout_error(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    queue = generation_queue(connection, "m", "normal")
    queue.enqueue_call(GENERATE_FUNCTION, kwargs={"job_id": "slow"}, job_id="slow", timeout=1)
    never = threading.Event()

    def generate(job_id: str) -> dict[str, str]:
        deadline = time.monotonic() + 20
        while not never.wait(0.05) and time.monotonic() < deadline:
            pass  # waits in slices, as `JobRunner` does, so the timeout can interrupt it
        return {"status": "succeeded"}

    worker = build_worker(connection, "timed", {GENERATE_FUNCTION: generate}, model="m")
    started = time.monotonic()
    worker.work(burst=True)
    assert time.monotonic() - started < 15
    assert FailedJobRegistry(queue=queue).get_job_ids(cleanup=False) == ["slow"]
    failure = Job.fetch("slow", connection=connection, serializer=JSONSerializer).latest_result()
    assert failure is not None and failure.exc_string is not None
    assert "JobTimeoutException" in failure.exc_string
    assert "maximum timeout value (1 seconds)" in failure.exc_string
    connection.close()


@pytest.mark.parametrize(
    ("raised", "client_mistake"),
    [
        (ContextLengthExceeded("the prompt asks for 2076 tokens of 2048"), True),
        (InvalidRequest("`response_format` has a schema this model cannot follow"), True),
        (RuntimeError("the engine broke"), False),
    ],
)
def test_a_job_refused_for_its_request_is_one_info_line_not_a_traceback(
    redis_url: str, caplog: pytest.LogCaptureFixture, raised: Exception, client_mistake: bool
) -> None:
    caplog.set_level(logging.INFO)
    connection = redis.Redis.from_url(redis_url)
    request = GenerationRequest(
        model="m", messages=(ChatMessage(role="user", content="hi"),), max_tokens=3
    )
    _admit_and_enqueue(connection, Settings(redis_url=redis_url), "job1", request)

    def generate(job_id: str, request: dict[str, object]) -> dict[str, str]:
        raise raised

    worker = build_worker(connection, "test-worker", {GENERATE_FUNCTION: generate}, model="m")
    worker.work(burst=True)
    queue = generation_queue(connection, "m", "normal")
    assert FailedJobRegistry(queue=queue).get_job_ids() == ["job1"]  # RQ still tells the truth
    about_the_job = [record for record in caplog.records if "job1" in record.getMessage()]
    errors = [record for record in about_the_job if record.levelno >= logging.ERROR]
    if client_mistake:
        assert errors == []
        [line] = [record for record in about_the_job if "refused" in record.getMessage()]
        assert line.levelno == logging.INFO and line.exc_info is None
        assert str(raised) in line.getMessage() and "\n" not in line.getMessage()
    else:
        assert errors and "Traceback" in errors[0].getMessage()
    connection.close()
