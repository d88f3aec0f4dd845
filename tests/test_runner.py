"""The job runner with a scripted engine (no model) and a real Redis."""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator, Sequence

import pytest
import redis

from shared import keys, scripts
from shared.generation import ChatMessage, GenerationRequest
from shared.script_runner import SyncScripts
from shared.settings import Settings
from worker.active_jobs import ActiveJobs, StopReason
from worker.engine import SamplingParams
from worker.runner import JobRunner


class ByteDecoder:
    """Each token is one byte of UTF-8: characters span several tokens, like 🚀 in BPE."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def step(self, token_id: int) -> str:
        return self._utf8.decode(bytes([token_id]))


class ScriptedEngine:
    max_context_tokens = 64

    def __init__(self, text: str, on_step: Callable[[int], None] = lambda _: None) -> None:
        self._tokens = list(text.encode())
        self._on_step = on_step
        self.seen: SamplingParams | None = None

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return [1, 2, 3]

    def sampling_defaults(self) -> tuple[float, float, int]:
        return (0.7, 0.8, 20)

    def new_decoder(self) -> ByteDecoder:
        return ByteDecoder()

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, should_stop: Callable[[], bool]
    ) -> Iterator[int]:
        self.seen = params
        for step, token in enumerate(self._tokens[: params.max_tokens]):
            if should_stop():
                return
            self._on_step(step)
            yield token


def request(max_tokens: int = 50, stop: tuple[str, ...] = ()) -> dict[str, object]:
    messages = (ChatMessage(role="user", content="x"),)
    return GenerationRequest(
        model="m", messages=messages, max_tokens=max_tokens, stop=stop
    ).model_dump(mode="json")


@pytest.fixture
def runner_parts(settings: Settings, sync_redis: redis.Redis) -> tuple[SyncScripts, ActiveJobs]:
    return SyncScripts(sync_redis), ActiveJobs()


def admit(run: SyncScripts, settings: Settings, job_id: str) -> None:
    scripts.check_admitted(run.run(scripts.admit(settings, job_id, "o", "m")))


def events(sync_redis: redis.Redis, job_id: str) -> list[dict[str, object]]:
    return [json.loads(f["e"]) for _, f in sync_redis.xrange(keys.job_events(job_id))]


def test_multibyte_characters_are_never_split_and_usage_counts_tokens(
    settings: Settings, sync_redis: redis.Redis, runner_parts: tuple[SyncScripts, ActiveJobs]
) -> None:
    run, active = runner_parts
    text = "你好🚀\r\nok"
    engine = ScriptedEngine(text)
    admit(run, settings, "j")
    JobRunner(engine, run, settings, "w", active).generate("j", request())
    log = events(sync_redis, "j")
    chunks = [e["text"] for e in log if e["type"] == "token"]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    assert sum(e["tokens"] for e in log if e["type"] == "token") == len(text.encode())
    assert log[-1]["type"] == "done" and log[-1]["finish_reason"] == "stop"
    assert log[-1]["usage"]["completion_tokens"] == len(text.encode())
    assert engine.seen is not None and engine.seen.temperature == 0.7


def test_max_tokens_gives_finish_reason_length(
    settings: Settings, sync_redis: redis.Redis, runner_parts: tuple[SyncScripts, ActiveJobs]
) -> None:
    run, active = runner_parts
    admit(run, settings, "j")
    JobRunner(ScriptedEngine("abcdefgh"), run, settings, "w", active).generate(
        "j", request(max_tokens=3)
    )
    log = events(sync_redis, "j")
    assert log[-1]["finish_reason"] == "length"
    assert sync_redis.get(keys.job_text("j")) == "abc"


def test_stop_string_ends_the_run_with_stop(
    settings: Settings, sync_redis: redis.Redis, runner_parts: tuple[SyncScripts, ActiveJobs]
) -> None:
    run, active = runner_parts
    admit(run, settings, "j")
    engine = ScriptedEngine("Thought: x\nObservation: y")
    JobRunner(engine, run, settings, "w", active).generate("j", request(stop=("Observation:",)))
    assert sync_redis.get(keys.job_text("j")) == "Thought: x\n"
    assert events(sync_redis, "j")[-1]["finish_reason"] == "stop"
    assert sync_redis.hget(keys.job("j"), "completion_tokens") == str(
        len("Thought: x\nObservation:")
    )


def test_cancel_stops_at_the_next_step(
    settings: Settings, sync_redis: redis.Redis, runner_parts: tuple[SyncScripts, ActiveJobs]
) -> None:
    run, active = runner_parts
    admit(run, settings, "j")

    def cancel_at_step(step: int) -> None:
        if step == 3:
            assert run.run(scripts.cancel(settings, "j")) == "cancelling"
            active.request_stop("j", StopReason.CANCELLED)

    engine = ScriptedEngine("abcdefghij", on_step=cancel_at_step)
    outcome = JobRunner(engine, run, settings, "w", active).generate("j", request())
    assert outcome == {"status": "cancelled"}
    assert sync_redis.get(keys.job_text("j")) == "abcd"
    assert sync_redis.hget(keys.job("j"), "status") == "cancelled"
    assert sync_redis.zcard(keys.leases()) == 0
    assert active.ids() == []


def test_context_overflow_fails_the_job_with_a_clear_error(
    settings: Settings, sync_redis: redis.Redis, runner_parts: tuple[SyncScripts, ActiveJobs]
) -> None:
    run, active = runner_parts
    admit(run, settings, "j")
    with pytest.raises(Exception, match="maximum context length is 64"):
        JobRunner(ScriptedEngine("a"), run, settings, "w", active).generate(
            "j", request(max_tokens=62)
        )
    assert sync_redis.hget(keys.job("j"), "error_type") == "context_length_exceeded"
    assert sync_redis.zcard(keys.leases()) == 0
