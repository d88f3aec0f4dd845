"""Job runner + batcher with a scripted engine (no model) and a real Redis."""

from __future__ import annotations

import codecs
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis

from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.generation import ChatMessage, FunctionTool, GenerationRequest
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts
from tokenrelay.shared.redis.rq_jobs import generation_queue, queued_job
from tokenrelay.shared.redis.scripts import ScriptCall, SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.active_jobs import ActiveJobs, StopReason
from tokenrelay.worker.batcher import Batcher, BatchJob
from tokenrelay.worker.engines.protocol import ModelLoadError, SamplingParams, TokenOutput
from tokenrelay.worker.failover_guard import FailoverGuard
from tokenrelay.worker.runner import JobRunner


class ByteDecoder:
    """Each token is one byte of UTF-8: characters span several tokens, like 🚀 in BPE."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def step(self, token_id: int) -> str:
        return self._utf8.decode(bytes([token_id]))


class ScriptedEngine:
    """Each sequence 'generates' the UTF-8 bytes of the text its prompt names, then EOS."""

    max_context_tokens = 64
    vocab_size = 256
    device = "cpu"

    def __init__(self, texts: dict[str, str], on_step: Callable[[int], None] = lambda _: None):
        self._texts = texts
        self._on_step = on_step
        self._rows: dict[str, tuple[list[int], SamplingParams]] = {}
        self.steps = 0
        self.batch_sizes: list[int] = []
        self.seen: SamplingParams | None = None

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool] = ()
    ) -> list[int]:
        return [1, 2, 3]

    def sampling_defaults(self) -> tuple[float, float, int]:
        return (0.7, 0.8, 20)

    def new_decoder(self) -> ByteDecoder:
        return ByteDecoder()

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id])

    def add(self, seq_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.seen = params
        self._rows[seq_id] = (list(self._texts[seq_id].encode()), params)

    def remove(self, seq_id: str) -> None:
        self._rows.pop(seq_id, None)

    def step(self) -> list[TokenOutput]:
        self._on_step(self.steps)
        self.steps += 1
        self.batch_sizes.append(len(self._rows))
        outputs = []
        for seq_id, (tokens, params) in list(self._rows.items()):
            produced = len(self._texts[seq_id].encode()) - len(tokens)
            if not tokens:
                outputs.append(TokenOutput(seq_id, None, "stop"))
                del self._rows[seq_id]
                continue
            token = tokens.pop(0)
            done = produced + 1 >= params.max_tokens
            outputs.append(TokenOutput(seq_id, token, "length" if done else None))
            if done:
                del self._rows[seq_id]
        return outputs


class CountingScripts(SyncScripts):
    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.emits: list[int] = []
        self.emitted: list[list[tuple[str, int]]] = []  # each EMIT call's (job id, seq)

    def run(self, call: ScriptCall, client: redis.Redis | None = None) -> Any:
        if call.source == plane_scripts.EMIT:
            events = emitted_events(call)
            self.emits.append(len(events))
            self.emitted.append(events)
        return super().run(call, client)


def emitted_events(call: ScriptCall) -> list[tuple[str, int]]:
    """(job id, seq) of each event of an EMIT call, group by group (`emit.lua`: after
    MAXLEN, the publish command and the number of groups, each group's channel and count,
    then its events' job id, entry id `1-<seq>` and event)."""
    events: list[tuple[str, int]] = []
    at = 3
    for _ in range(int(call.args[2])):
        count, at = int(call.args[at + 1]), at + 2
        for _ in range(count):
            job_id, entry = call.args[at], str(call.args[at + 1])
            events.append((str(job_id), int(entry.removeprefix("1-"))))
            at += 3
    return events


def request(max_tokens: int = 50, stop: tuple[str, ...] = ()) -> dict[str, object]:
    messages = (ChatMessage(role="user", content="x"),)
    body = GenerationRequest(model="m", messages=messages, max_tokens=max_tokens, stop=stop)
    return body.model_dump(mode="json")


@pytest.fixture
def settings(redis_url: str) -> Settings:
    """No coalescing: every step sends one event per job, as these tests count them
    (`test_flush_interval_*` cover coalescing)."""
    return Settings(
        redis_url=redis_url, max_inflight=2, lease_ttl_s=3, max_queue_wait_s=5, flush_interval_ms=0
    )


@pytest.fixture
def parts(settings: Settings, sync_redis: redis.Redis) -> tuple[CountingScripts, ActiveJobs]:
    return CountingScripts(sync_redis), ActiveJobs()


class CountingBatcher(Batcher):
    submitted = threading.Semaphore(0)

    def submit(self, job: BatchJob) -> None:
        super().submit(job)
        self.submitted.release()


@pytest.fixture
def runner_for(
    settings: Settings, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> Iterator[Callable[[ScriptedEngine], JobRunner]]:
    run, active = parts
    batchers: list[Batcher] = []

    def make(engine: ScriptedEngine) -> JobRunner:
        batcher = CountingBatcher(lambda: engine, run, settings, active)
        batcher.start()
        batchers.append(batcher)
        return JobRunner(engine, batcher, run, settings, "w", active, guard(settings, sync_redis))

    yield make
    for batcher in batchers:
        batcher.stop()


def generate_alone(
    build: Callable[[], ScriptedEngine],
    run: SyncScripts,
    settings: Settings,
    active: ActiveJobs,
    client: redis.Redis,
) -> None:
    """Run job "j" to its end on a batcher of its own, whose engine `build` makes."""
    batcher = Batcher(build, run, settings, active)
    engine = batcher.start()
    try:
        JobRunner(engine, batcher, run, settings, "w", active, guard(settings, client)).generate(
            "j", request()
        )
    finally:
        batcher.stop()


def guard(settings: Settings, client: redis.Redis) -> FailoverGuard:
    """No Sentinel: no primary is named."""
    return FailoverGuard(settings, client, lambda: None)


def admit(run: SyncScripts, settings: Settings, job_id: str) -> None:
    job_scripts.check_admitted(run.run(job_scripts.admit(settings, job_id, "o", "m")))


def events(sync_redis: redis.Redis, job_id: str) -> list[dict[str, Any]]:
    return [json.loads(f["e"]) for _, f in sync_redis.xrange(keys.job_events(job_id))]


def test_multibyte_characters_are_never_split_and_usage_counts_tokens(
    settings: Settings,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    runner_for: Any,
) -> None:
    run, _ = parts
    text = "你好🚀\r\nok"
    engine = ScriptedEngine({"j": text})
    admit(run, settings, "j")
    runner_for(engine).generate("j", request())
    log = events(sync_redis, "j")
    chunks = [e["text"] for e in log if e["type"] == "token"]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    assert sum(e["tokens"] for e in log if e["type"] == "token") == len(text.encode())
    assert log[-1]["type"] == "done" and log[-1]["finish_reason"] == "stop"
    assert log[-1]["usage"]["completion_tokens"] == len(text.encode())
    assert engine.seen is not None and engine.seen.temperature == 0.7


def test_max_tokens_gives_finish_reason_length_and_the_last_chunk_goes_with_finish(
    settings: Settings,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    runner_for: Any,
) -> None:
    """The step that ends the job sends its last chunk in FINISH, not in an EMIT call."""
    run, _ = parts
    admit(run, settings, "j")
    runner_for(ScriptedEngine({"j": "abcdefgh"})).generate("j", request(max_tokens=3))
    assert events(sync_redis, "j")[-1]["finish_reason"] == "length"
    assert sync_redis.get(keys.job_text("j")) == "abc"
    assert [call for call in run.emitted if ("j", 3) in call] == []
    assert [(e["seq"], e["type"], e.get("text")) for e in events(sync_redis, "j")] == [
        (0, "started", None),
        (1, "token", "a"),
        (2, "token", "b"),
        (3, "token", "c"),
        (4, "done", None),
    ]


def test_stop_string_ends_the_run_with_stop(
    settings: Settings,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    runner_for: Any,
) -> None:
    run, _ = parts
    admit(run, settings, "j")
    engine = ScriptedEngine({"j": "Thought: x\nObservation: y"})
    runner_for(engine).generate("j", request(stop=("Observation:",)))
    assert sync_redis.get(keys.job_text("j")) == "Thought: x\n"
    assert events(sync_redis, "j")[-1]["finish_reason"] == "stop"
    expected = str(len("Thought: x\nObservation:"))
    assert sync_redis.hget(keys.job("j"), "completion_tokens") == expected


def cancel_at_step_4(
    run: CountingScripts, settings: Settings, active: ActiveJobs
) -> Callable[[int], None]:
    """An engine's `on_step` that cancels job "j" as a client would during step 4."""

    def cancel_at_step(step: int) -> None:
        if step == 4:
            assert run.run(job_scripts.cancel(settings, "j")) == "cancelling"
            active.request_stop("j", StopReason.CANCELLED)

    return cancel_at_step


def test_cancel_stops_at_the_next_step(
    settings: Settings,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    runner_for: Any,
) -> None:
    run, active = parts
    admit(run, settings, "j")

    engine = ScriptedEngine({"j": "abcdefghij"}, on_step=cancel_at_step_4(run, settings, active))
    outcome = runner_for(engine).generate("j", request())
    assert outcome == {"status": "cancelled"}
    # Requested during step 4 (which still yields "e"); step 5 never runs for this job.
    assert sync_redis.get(keys.job_text("j")) == "abcde"
    assert sync_redis.hget(keys.job("j"), "status") == "cancelled"
    assert sync_redis.zcard(keys.leases()) == 0
    assert active.ids() == []


def test_context_overflow_fails_the_job_with_a_clear_error(
    settings: Settings,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    runner_for: Any,
) -> None:
    run, _ = parts
    admit(run, settings, "j")
    with pytest.raises(Exception, match="maximum context length is 64"):
        runner_for(ScriptedEngine({"j": "a"})).generate("j", request(max_tokens=62))
    assert sync_redis.hget(keys.job("j"), "error_type") == "context_length_exceeded"
    assert sync_redis.zcard(keys.leases()) == 0


def test_jobs_share_steps_and_each_step_is_one_round_trip(
    redis_url: str,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    runner_for: Any,
) -> None:
    run, _ = parts
    settings = Settings(redis_url=redis_url, max_inflight=8)
    texts = {f"j{i}": "x" * (10 + 5 * i) for i in range(4)}
    for job_id in texts:
        admit(run, settings, job_id)
    release = threading.Event()
    engine = ScriptedEngine(texts, on_step=lambda step: release.wait(5) if step == 0 else None)
    runner = runner_for(engine)
    CountingBatcher.submitted = threading.Semaphore(0)
    threads = [
        threading.Thread(target=runner.generate, args=(job_id, request())) for job_id in texts
    ]
    for thread in threads:
        thread.start()
    for _ in texts:
        assert CountingBatcher.submitted.acquire(timeout=10)
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    for job_id, text in texts.items():
        assert sync_redis.get(keys.job_text(job_id)) == text
        assert sync_redis.hget(keys.job(job_id), "status") == "succeeded"
    assert max(engine.batch_sizes) == 4
    assert len(run.emits) <= engine.steps
    assert max(run.emits) == 4


def test_the_batcher_builds_its_engine_on_the_thread_that_steps_it(
    redis_url: str, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    """One thread runs all of the engine's torch work, so torch's OpenMP threads form one
    pool (a second pool made libgomp sleep between parallel regions:
    docs/benchmarks/probes.md)."""
    run, active = parts
    settings = Settings(redis_url=redis_url, flush_interval_ms=0)
    admit(run, settings, "j")
    threads: dict[str, int] = {}

    def build() -> ScriptedEngine:
        threads["build"] = threading.get_ident()
        return ScriptedEngine(
            {"j": "ok"}, on_step=lambda _: threads.setdefault("step", threading.get_ident())
        )

    generate_alone(build, run, settings, active, sync_redis)
    assert threads["build"] == threads["step"] != threading.get_ident()


def test_an_engine_that_cannot_be_built_fails_the_batchers_start(
    settings: Settings, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    run, active = parts

    def build() -> ScriptedEngine:
        raise ModelLoadError("no such model")

    batcher = Batcher(build, run, settings, active)
    with pytest.raises(ModelLoadError, match="no such model"):
        batcher.start()


def test_flush_interval_coalesces_tokens_into_fewer_events(
    redis_url: str, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    run, active = parts
    settings = Settings(redis_url=redis_url, flush_interval_ms=60_000)
    admit(run, settings, "j")
    engine = ScriptedEngine({"j": "coalesce me please"})
    generate_alone(lambda: engine, run, settings, active, sync_redis)
    chunks = [e for e in events(sync_redis, "j") if e["type"] == "token"]
    assert [c["text"] for c in chunks] == ["c", "oalesce me please"]
    assert sum(c["tokens"] for c in chunks) == len("coalesce me please")


def test_flush_interval_sends_each_token_of_steps_a_little_under_the_interval_apart(
    redis_url: str, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    """Steps 195 ms apart against a 200 ms interval (a 20 tok/s stream against 50 ms, with a
    step's jitter) are not held into two-token chunks every other step."""
    run, active = parts
    settings = Settings(redis_url=redis_url, flush_interval_ms=200)
    admit(run, settings, "j")
    engine = ScriptedEngine({"j": "abcd"}, on_step=lambda _: time.sleep(0.195))
    generate_alone(lambda: engine, run, settings, active, sync_redis)
    chunks = [e for e in events(sync_redis, "j") if e["type"] == "token"]
    assert [c["text"] for c in chunks] == ["a", "b", "c", "d"]


class OddStepsWithoutA(ScriptedEngine):
    """Job "a" decodes on even steps only, so a flush tick may come on a step without it."""

    def step(self) -> list[TokenOutput]:
        resting = self._rows.pop("a", None) if self.steps % 2 else None
        try:
            return super().step()
        finally:
            if resting is not None:
                self._rows["a"] = resting


def test_flush_interval_sends_the_held_tokens_of_every_job_on_one_tick(
    redis_url: str, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    """Two jobs that started at different steps: while both run, each held chunk goes out on
    the worker's tick with the other job's, in one EMIT call, not on a schedule of its own,
    even when the tick's step decoded no token of it."""
    run, active = parts
    settings = Settings(redis_url=redis_url, max_inflight=4, flush_interval_ms=100)
    texts = {"a": "a" * 40, "b": "b" * 30}
    for job_id in texts:
        admit(run, settings, job_id)
    threads: dict[str, threading.Thread] = {}

    def step(n: int) -> None:
        if n == 2:  # "b" joins after "a"'s first chunk, before its next tick
            threads["b"].start()
            assert CountingBatcher.submitted.acquire(timeout=10)
        time.sleep(0.02)

    engine = OddStepsWithoutA(texts, on_step=step)
    batcher = CountingBatcher(lambda: engine, run, settings, active)
    runner = JobRunner(engine, batcher, run, settings, "w", active, guard(settings, sync_redis))
    for job_id in texts:
        threads[job_id] = threading.Thread(target=runner.generate, args=(job_id, request()))
    CountingBatcher.submitted = threading.Semaphore(0)
    batcher.start()
    try:
        threads["a"].start()
        for thread in threads.values():
            thread.join(timeout=30)
    finally:
        batcher.stop()
    for job_id, text in texts.items():
        assert sync_redis.get(keys.job_text(job_id)) == text
    calls = run.emitted
    b_first = next(i for i, call in enumerate(calls) if ("b", 1) in call)
    last_seqs = {
        job_id: max(s for call in calls for j, s in call if j == job_id) for job_id in texts
    }
    first_end = next(i for i, call in enumerate(calls) if any(s == last_seqs[j] for j, s in call))
    while_both_ran = calls[b_first + 1 : first_end]
    assert while_both_ran
    assert all({job_id for job_id, _ in call} == set(texts) for call in while_both_ran)


def test_flush_interval_never_drops_the_tokens_it_held_when_a_job_is_cancelled(
    redis_url: str, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    run, active = parts
    settings = Settings(redis_url=redis_url, flush_interval_ms=60_000)
    admit(run, settings, "j")

    engine = ScriptedEngine({"j": "abcdefghij"}, on_step=cancel_at_step_4(run, settings, active))
    batcher = Batcher(lambda: engine, run, settings, active)
    batcher.start()
    try:
        outcome = JobRunner(
            engine, batcher, run, settings, "w", active, guard(settings, sync_redis)
        ).generate("j", request())
    finally:
        batcher.stop()
    assert outcome == {"status": "cancelled"}
    chunks = [e for e in events(sync_redis, "j") if e["type"] == "token"]
    assert [c["text"] for c in chunks] == ["a", "bcde"]
    assert sync_redis.get(keys.job_text("j")) == "abcde"
    assert sync_redis.hget(keys.job("j"), "completion_tokens") == "5"


class FlakyScripts(SyncScripts):
    """Fails calls of the named scripts by turns: before Redis saw them, or after (the reply
    lost), so the worker must resend without duplicating."""

    def __init__(self, client: redis.Redis, sources: tuple[str, ...]) -> None:
        super().__init__(client)
        self._sources = sources
        self.calls = 0

    def run(self, call: ScriptCall, client: redis.Redis | None = None) -> Any:
        if call.source not in self._sources:
            return super().run(call, client)
        self.calls += 1
        if self.calls % 3 == 1:
            raise redis.ConnectionError("injected: lost before Redis")
        reply = super().run(call, client)
        if self.calls % 3 == 2:
            raise redis.ConnectionError("injected: reply lost")
        return reply


def test_events_and_finish_survive_redis_errors_each_applied_once(
    settings: Settings, sync_redis: redis.Redis
) -> None:
    run = FlakyScripts(sync_redis, (job_scripts.START, plane_scripts.EMIT, job_scripts.FINISH))
    active = ActiveJobs()
    text = "every token reaches the log once"
    engine = ScriptedEngine({"j": text})
    admit(run, settings, "j")
    batcher = Batcher(lambda: engine, run, settings, active)
    batcher.start()
    try:
        status = JobRunner(
            engine, batcher, run, settings, "w", active, guard(settings, sync_redis)
        ).generate("j", request())
    finally:
        batcher.stop()
    assert status == {"status": "succeeded"}
    log = events(sync_redis, "j")
    assert [e["seq"] for e in log] == list(range(len(log)))
    assert [e["type"] for e in log].count("done") == 1
    tokens = [e for e in log if e["type"] == "token"]
    assert "".join(e["text"] for e in tokens) == text == sync_redis.get(keys.job_text("j"))
    assert sum(e["tokens"] for e in tokens) == len(text) == log[-1]["usage"]["completion_tokens"]
    assert sync_redis.zcard(keys.leases()) == 0


def test_events_redis_lost_after_acknowledging_them_are_sent_again(
    settings: Settings, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    run, active = parts
    text = "an AOF without its last second"

    def forget_tail(step: int) -> None:
        """What a restart from `appendfsync everysec` does: the newest writes are gone."""
        if step == 12:
            kept = sync_redis.xrange(keys.job_events("j"), max="1-4")
            sync_redis.delete(keys.job_events("j"))
            for entry_id, fields in kept:
                sync_redis.xadd(keys.job_events("j"), fields, id=entry_id)
            sync_redis.set(keys.job_text("j"), text[:4])

    engine = ScriptedEngine({"j": text}, on_step=forget_tail)
    admit(run, settings, "j")
    batcher = Batcher(lambda: engine, run, settings, active)
    batcher.start()
    try:
        JobRunner(
            engine, batcher, run, settings, "w", active, guard(settings, sync_redis)
        ).generate("j", request())
    finally:
        batcher.stop()
    log = events(sync_redis, "j")
    assert [e["seq"] for e in log] == list(range(len(log)))
    assert "".join(e["text"] for e in log if e["type"] == "token") == text
    assert sync_redis.get(keys.job_text("j")) == text
    assert sync_redis.hget(keys.job("j"), "status") == "succeeded"


def test_a_job_whose_start_a_failover_discarded_goes_back_to_its_queue(
    settings: Settings,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    runner_for: Any,
) -> None:
    """The new primary received the worker's dequeue but not the job's start (the promotion
    fell between them): the worker runs the job on the old primary, then finds it queued on
    the new one and in no queue. It gives it back, so it runs again instead of expiring."""
    run, _ = parts
    with redis.Redis.from_url(settings.redis_url) as rq_connection:
        generation = GenerationRequest.model_validate(request())
        entry = queued_job(rq_connection, settings, "j", generation)
        job_scripts.check_admitted(
            run.run(job_scripts.admit(settings, "j", "o", "m", enqueue=entry))
        )
        queue_key = generation_queue(rq_connection, "m", "normal").key
    deadline = sync_redis.zscore(keys.leases(), "j")
    assert sync_redis.lpop(queue_key) == "j"  # the worker's dequeue, replicated

    def lose_the_start(step: int) -> None:
        """The new primary's copy: the job as its admission left it, no log."""
        if step == 2:
            sync_redis.hset(keys.job("j"), "status", "queued")
            sync_redis.delete(keys.job_events("j"))
            sync_redis.zadd(keys.leases(), {"j": deadline})

    runner = runner_for(ScriptedEngine({"j": "a long reply"}, on_step=lose_the_start))
    assert runner.generate("j", request()) == {"status": "queued"}
    assert sync_redis.hget(keys.job("j"), "status") == "queued"
    assert sync_redis.zscore(keys.leases(), "j") == deadline
    assert sync_redis.lrange(queue_key, 0, -1) == ["j"]
    again = runner_for(ScriptedEngine({"j": "again"}))
    assert again.generate("j", request()) == {"status": "succeeded"}
    assert sync_redis.get(keys.job_text("j")) == "again"


Snapshot = list[tuple[Any, int, Any]]


def snapshot(raw: redis.Redis) -> Snapshot:
    """Every key of the database as `DUMP` gives it, with its TTL."""
    return [(key, max(int(raw.pttl(key)), 0), raw.dump(key)) for key in raw.keys("*")]


class DeposedAtFinish(FailoverGuard):
    """The primary that takes the job's FINISH (the second write the guard sees, after
    START) was deposed: what it took is discarded (the new primary holds the database as
    `taken` left it, mid-generation), and the guard says the write does not hold."""

    def __init__(self, settings: Settings, client: redis.Redis, raw: redis.Redis) -> None:
        super().__init__(settings, client, lambda: None)
        self._raw = raw
        self.taken: Snapshot = []
        self.applies = 0

    def apply(
        self, write: Callable[[redis.Redis], Any], wrote: Callable[[Any], bool]
    ) -> tuple[Any, bool]:
        self.applies += 1
        reply, holds = super().apply(write, wrote)
        if self.applies != 2:
            return reply, holds
        self._raw.flushdb()
        for key, ttl_ms, value in self.taken:
            self._raw.restore(key, ttl_ms, value)
        return reply, False


def test_an_end_a_deposed_primary_took_is_made_again_with_the_events_it_lacked(
    settings: Settings, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    """With `MIN_REPLICAS`, a FINISH no replica acknowledged on a server the sentinels no
    longer name is made again: before, the job stayed running on the new primary, its lease
    ran out and a job whose generation had completed was recorded `worker_lost`."""
    run, active = parts
    text = "the end reached the old primary"
    with redis.Redis.from_url(settings.redis_url) as raw:
        guard = DeposedAtFinish(settings, sync_redis, raw)

        def take(step: int) -> None:
            if step == 8:
                guard.taken = snapshot(raw)

        engine = ScriptedEngine({"j": text}, on_step=take)
        admit(run, settings, "j")
        batcher = Batcher(lambda: engine, run, settings, active)
        batcher.start()
        try:
            status = JobRunner(engine, batcher, run, settings, "w", active, guard).generate(
                "j", request()
            )
        finally:
            batcher.stop()
    assert status == {"status": "succeeded"} and guard.applies == 3
    log = events(sync_redis, "j")
    assert [e["seq"] for e in log] == list(range(len(log)))
    assert [e["type"] for e in log].count("done") == 1
    assert "".join(e["text"] for e in log if e["type"] == "token") == text
    assert sync_redis.get(keys.job_text("j")) == text
    assert sync_redis.hget(keys.job("j"), "status") == "succeeded"
    assert sync_redis.zcard(keys.leases()) == 0


class LongChatEngine(ScriptedEngine):
    """Twenty tokens per turn: a long history overflows the 64-token context."""

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool] = ()
    ) -> list[int]:
        return [1] * (20 * len(messages))


@pytest.mark.parametrize("truncate", [False, True])
def test_truncation_drops_the_oldest_turns_only_when_the_setting_is_on(
    settings: Settings,
    sync_redis: redis.Redis,
    parts: tuple[CountingScripts, ActiveJobs],
    truncate: bool,
) -> None:
    run, active = parts
    settings = settings.model_copy(update={"truncate_messages": truncate})
    engine = LongChatEngine({"j": "ok"})
    batcher = Batcher(lambda: engine, run, settings, active)
    batcher.start()
    try:
        admit(run, settings, "j")
        turns = [ChatMessage(role="user" if i % 2 else "assistant", content="t") for i in range(6)]
        body = GenerationRequest(model="m", messages=tuple(turns), max_tokens=10)
        runner = JobRunner(engine, batcher, run, settings, "w", active, guard(settings, sync_redis))
        if not truncate:
            with pytest.raises(Exception, match="maximum context length is 64"):
                runner.generate("j", body.model_dump(mode="json"))
            return
        runner.generate("j", body.model_dump(mode="json"))
    finally:
        batcher.stop()
    log = events(sync_redis, "j")
    assert log[0]["type"] == "started" and log[0]["prompt_tokens"] == 40  # 2 turns kept
    assert log[-1]["type"] == "done"


def test_a_token_plane_of_its_own_gets_the_log_and_text_and_the_control_redis_the_end(
    settings: Settings, sync_redis: redis.Redis
) -> None:
    with EmbeddedRedis() as plane_server:
        split = settings.model_copy(update={"stream_redis_url": plane_server.url})
        plane = redis.Redis.from_url(plane_server.url, decode_responses=True)
        control, on_plane, active = SyncScripts(sync_redis), SyncScripts(plane), ActiveJobs()
        engine = ScriptedEngine({"j": "你好🚀"})
        batcher = Batcher(lambda: engine, on_plane, split, active)
        batcher.start()
        try:
            admit(control, split, "j")
            runner = JobRunner(
                engine, batcher, control, split, "w", active, guard(split, sync_redis), on_plane
            )
            assert runner.generate("j", request()) == {"status": "succeeded"}
        finally:
            batcher.stop()
        log = events(plane, "j")
        assert [e["seq"] for e in log] == list(range(len(log)))
        assert log[0]["type"] == "started" and log[-1]["type"] == "done"
        assert plane.get(keys.job_text("j")) == "你好🚀"
        assert sync_redis.hget(keys.job("j"), "status") == "succeeded"
        assert sync_redis.keys("tokenrelay:job:{*") == []
        plane.close()


def test_rqs_record_of_a_start_waits_for_the_batcher_to_take_the_job(
    settings: Settings, sync_redis: redis.Redis, parts: tuple[CountingScripts, ActiveJobs]
) -> None:
    run, active = parts
    engine = ScriptedEngine({"j": "hello"})
    batcher = CountingBatcher(lambda: engine, run, settings, active)
    submitted: list[BatchJob] = []
    submit = batcher.submit

    def recording_submit(job: BatchJob) -> None:
        submitted.append(job)
        submit(job)

    batcher.submit = recording_submit  # type: ignore[method-assign]
    taken_when_recorded: list[bool] = []
    batcher.start()
    try:
        admit(run, settings, "j")
        JobRunner(
            engine,
            batcher,
            run,
            settings,
            "w",
            active,
            guard(settings, sync_redis),
            on_started=lambda: taken_when_recorded.append(submitted[0].taken.is_set()),
        ).generate("j", request())
    finally:
        batcher.stop()
    assert taken_when_recorded == [True]
    assert "".join(e.get("text", "") for e in events(sync_redis, "j")) == "hello"
