"""The scripts of a continuation against a real Redis: the reaper puts a running job whose
lease expired back at the front of its queue, START hands the next worker what was
delivered, and the earlier worker's RENEW, EMIT and FINISH write nothing into the job."""

from __future__ import annotations

import json

import pytest
import redis
from rq.job import Job
from rq.registry import StartedJobRegistry

from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.generation import ChatMessage, GenerationRequest
from tokenrelay.shared.jobs import JobField, JobRecord
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts
from tokenrelay.shared.redis.rq_jobs import generation_queue, queued_job
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings

REQUEST = GenerationRequest(
    model="m", messages=(ChatMessage(role="user", content="hi"),), max_tokens=8
)


@pytest.fixture
def run(sync_redis: redis.Redis) -> SyncScripts:
    return SyncScripts(sync_redis)


@pytest.fixture
def rq_connection(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def admit_queued(
    run: SyncScripts, settings: Settings, connection: redis.Redis, job_id: str
) -> None:
    entry = queued_job(connection, settings, job_id, REQUEST)
    job_scripts.check_admitted(
        run.run(job_scripts.admit(settings, job_id, "o", "m", enqueue=entry))
    )


def start(run: SyncScripts, settings: Settings, job_id: str, worker: str) -> job_scripts.StartReply:
    started = Started(worker=worker, prompt_tokens=3).to_wire()
    return job_scripts.parse_start(run.run(job_scripts.start(settings, job_id, worker, started)))


def chunk(text: str, ids: list[int]) -> str:
    return TokenChunk(text=text, tokens=len(ids), token_ids=ids).to_wire()


def log(sync_redis: redis.Redis, job_id: str) -> list[dict[str, object]]:
    return [json.loads(f["e"]) for _, f in sync_redis.xrange(keys.job_events(job_id))]


def expire(sync_redis: redis.Redis, job_id: str) -> None:
    sync_redis.zadd(keys.leases(), {job_id: 0})


def running_on_w1_with_two_chunks(
    run: SyncScripts, settings: Settings, connection: redis.Redis, job_id: str = "j"
) -> None:
    admit_queued(run, settings, connection, job_id)
    queue = generation_queue(connection, "m", "normal")
    assert queue.pop_job_id() == job_id  # as a worker's dequeue takes it
    assert start(run, settings, job_id, "w1").status == "running"
    items = [(job_id, 1, chunk("Hel", [7, 8])), (job_id, 2, chunk("lo", [9]))]
    assert run.run(plane_scripts.emit(settings, items)) == [[], []]


def test_reap_puts_a_running_job_with_attempts_left_back_at_the_front_of_its_queue(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis, rq_connection: redis.Redis
) -> None:
    running_on_w1_with_two_chunks(run, settings, rq_connection)
    admit_queued(run, settings, rq_connection, "behind")
    registry = StartedJobRegistry(queue=generation_queue(rq_connection, "m", "normal")).key
    sync_redis.zadd(registry, {"j:lost-execution": 1, "jj:another-jobs": 1})
    expire(sync_redis, "j")
    assert run.run(job_scripts.reap(settings)) == []  # not lost: continued
    fields = sync_redis.hgetall(keys.job("j"))
    assert fields[JobField.STATUS] == "queued"
    assert fields[JobField.ATTEMPT] == "2"
    assert fields[JobField.PAST_WORKERS] == "w1"
    assert JobField.WORKER not in fields
    lease = sync_redis.zscore(keys.leases(), "j")
    assert lease is not None and lease > 0  # the queue wait's, not the expired one
    queue = generation_queue(rq_connection, "m", "normal")
    assert queue.get_job_ids() == ["j", "behind"]
    job = Job.fetch("j", connection=rq_connection)
    assert job.get_status(refresh=False) == "queued"
    assert sync_redis.get(keys.migrations()) == "1"
    assert sync_redis.zrange(registry, 0, -1) == ["jj:another-jobs"]
    assert [event["type"] for event in log(sync_redis, "j")] == ["started", "token", "token"]


def test_the_continuations_start_returns_what_was_delivered_and_says_it_continues(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis, rq_connection: redis.Redis
) -> None:
    running_on_w1_with_two_chunks(run, settings, rq_connection)
    expire(sync_redis, "j")
    run.run(job_scripts.reap(settings))
    reply = start(run, settings, "j", "w2")
    assert (reply.status, reply.attempt) == ("running", 2)
    assert [json.loads(event)["token_ids"] for event in reply.delivered] == [[7, 8], [9]]
    assert start(run, settings, "j", "w2") == reply  # a resend after a lost reply
    events = log(sync_redis, "j")
    assert events[-1] == {"seq": 3, "type": "started", "worker": "w2", "prompt_tokens": 3,
                          "attempt": 2}  # fmt: skip
    record = JobRecord.from_redis("j", sync_redis.hgetall(keys.job("j")), "")
    assert (record.attempts, record.workers) == (2, ["w1", "w2"])


def test_the_earlier_worker_that_comes_back_writes_nothing_into_the_continued_job(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis, rq_connection: redis.Redis
) -> None:
    running_on_w1_with_two_chunks(run, settings, rq_connection)
    expire(sync_redis, "j")
    run.run(job_scripts.reap(settings))
    start(run, settings, "j", "w2")
    before = log(sync_redis, "j")
    renewed = job_scripts.parse_renew(run.run(job_scripts.renew(settings, ["j"], "w1")))
    assert renewed.lost == ["j"]
    assert job_scripts.parse_renew(run.run(job_scripts.renew(settings, ["j"], "w2"))).lost == []
    # w1's next events take the seq of w2's Started event: refused, and w1 told it is gone.
    stale = [("j", 3, chunk("!", [10])), ("j", 4, chunk("?", [11]))]
    assert run.run(plane_scripts.emit(settings, stale)) == [["j"], []]
    done = Done(finish_reason="length", usage=Usage(prompt_tokens=3, completion_tokens=5,
                                                    total_tokens=8)).to_wire()  # fmt: skip
    finish = job_scripts.finish(
        settings, "j", "succeeded", {}, done, 5, "Hello!?", stale, worker="w1"
    )
    assert run.run(finish) == 0
    assert log(sync_redis, "j") == before
    assert sync_redis.hget(keys.job("j"), JobField.STATUS) == "running"
    ours = [("j", 4, chunk("lo", [12]))]
    assert run.run(plane_scripts.emit(settings, ours)) == [[], []]
    finish = job_scripts.finish(settings, "j", "succeeded", {}, done, 5, "Hellolo", worker="w2")
    assert run.run(finish) == 1
    assert [event["seq"] for event in log(sync_redis, "j")] == [0, 1, 2, 3, 4, 5]


def test_after_its_last_attempt_an_expired_job_ends_worker_lost(
    run: SyncScripts, redis_url: str, sync_redis: redis.Redis, rq_connection: redis.Redis
) -> None:
    settings = Settings(redis_url=redis_url, job_max_attempts=2)
    running_on_w1_with_two_chunks(run, settings, rq_connection)
    expire(sync_redis, "j")
    assert run.run(job_scripts.reap(settings)) == []
    assert start(run, settings, "j", "w2").attempt == 2
    expire(sync_redis, "j")
    assert run.run(job_scripts.reap(settings)) == ["j"]
    assert sync_redis.hget(keys.job("j"), JobField.STATUS) == "failed"
    assert log(sync_redis, "j")[-1]["error_type"] == "worker_lost"
    assert sync_redis.zscore(keys.leases(), "j") is None


def test_a_job_whose_log_was_trimmed_is_not_continued(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis, rq_connection: redis.Redis
) -> None:
    running_on_w1_with_two_chunks(run, settings, rq_connection)
    sync_redis.xdel(keys.job_events("j"), "1-0")  # as MAXLEN trims a long job's log
    expire(sync_redis, "j")
    assert run.run(job_scripts.reap(settings)) == ["j"]
    assert sync_redis.hget(keys.job("j"), JobField.STATUS) == "failed"


def test_a_stopping_worker_hands_only_its_own_running_job_over(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis, rq_connection: redis.Redis
) -> None:
    running_on_w1_with_two_chunks(run, settings, rq_connection)
    assert run.run(job_scripts.hand_over(settings, "j", "w2")) == 0
    assert run.run(job_scripts.hand_over(settings, "j", "w1")) == 1
    assert run.run(job_scripts.hand_over(settings, "j", "w1")) == 0  # queued now: once
    assert sync_redis.hget(keys.job("j"), JobField.STATUS) == "queued"
    assert generation_queue(rq_connection, "m", "normal").get_job_ids() == ["j"]
    assert start(run, settings, "j", "w2").attempt == 2
