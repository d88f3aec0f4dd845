"""The benchmark-only synthetic engine: refused unless enabled, paced, same protocol."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import ValidationError

from tokenrelay.shared.settings import Settings
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.synthetic_engine import SyntheticEngine


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens, 0, 1.0, 1.0, 0, None)


def test_synthetic_engine_is_refused_unless_explicitly_allowed() -> None:
    with pytest.raises(ValidationError, match="ALLOW_SYNTHETIC_ENGINE"):
        Settings(engine="synthetic")
    assert Settings(engine="synthetic", allow_synthetic_engine=True).engine == "synthetic"
    assert Settings().engine == "transformers"


def test_tokens_come_at_the_configured_rate_and_length() -> None:
    engine = SyntheticEngine(tokens_per_s=200, first_token_ms=0)
    started = time.monotonic()  # before the engine's own clock starts: elapsed is never short
    engine.add("a", [1], params(5))
    engine.add("b", [1], params(3))
    produced: dict[str, int] = {"a": 0, "b": 0}
    finished: dict[str, str | None] = {}
    while len(finished) < 2:
        for output in engine.step():
            produced[output.seq_id] += 1
            if output.finish_reason:
                finished[output.seq_id] = output.finish_reason
        assert time.monotonic() - started < 5
    elapsed = time.monotonic() - started
    assert produced == {"a": 5, "b": 3}
    assert finished == {"a": "length", "b": "length"}
    assert elapsed >= 4 / 200
    assert engine.step() == []


def _steps_until_done(engine: SyntheticEngine, expected: int) -> list[set[str]]:
    """The sequences that got a token in each non-empty step, until `expected` finished."""
    steps: list[set[str]] = []
    finished = 0
    deadline = time.monotonic() + 5
    while finished < expected:
        outputs = engine.step()
        if outputs:
            steps.append({output.seq_id for output in outputs})
        finished += sum(1 for output in outputs if output.finish_reason)
        assert time.monotonic() < deadline
    return steps


def test_in_lockstep_a_new_sequence_starts_at_once_then_decodes_with_the_batch() -> None:
    engine = SyntheticEngine(tokens_per_s=20, first_token_ms=0)
    engine.add("a", [1], params(4))
    assert [output.seq_id for output in engine.step()] == ["a"]
    engine.add("b", [1], params(4))
    assert [output.seq_id for output in engine.step()] == ["b"]
    steps = _steps_until_done(engine, 2)
    assert steps == [{"a", "b"}] * 3


def test_without_lockstep_each_sequence_keeps_its_own_phase() -> None:
    engine = SyntheticEngine(tokens_per_s=20, first_token_ms=0, lockstep=False)
    engine.add("a", [1], params(4))
    assert [output.seq_id for output in engine.step()] == ["a"]
    time.sleep(0.025)  # b's phase: half of the 50 ms interval behind a's
    engine.add("b", [1], params(4))
    assert [output.seq_id for output in engine.step()] == ["b"]
    steps = _steps_until_done(engine, 2)
    assert steps == [{"a"}, {"b"}] * 3


def test_a_step_waiting_for_its_next_token_returns_when_a_job_arrives() -> None:
    arrivals = threading.Event()
    engine = SyntheticEngine(tokens_per_s=0.5, first_token_ms=0, arrivals=arrivals)
    engine.add("a", [1], params(4))
    assert [output.seq_id for output in engine.step()] == ["a"]
    arrivals.set()  # as `Batcher.submit` does
    started = time.monotonic()
    assert engine.step() == []
    assert time.monotonic() - started < 1.0  # a's next token is 2 s away
    assert not arrivals.is_set()
