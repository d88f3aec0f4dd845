"""The vLLM engine's CPU prefill pacing, against a stand-in for vLLM's `LLMEngine`: pending
prompts go to vLLM whole, oldest first, up to the step's prompt-token budget (the first one
whatever its length), and a removed prompt that vLLM never saw is dropped, not aborted."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from tokenrelay.worker.engines.vllm_engine import VllmEngine


class StandInEngine:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, seq_id: str, prompt: dict[str, list[int]], sampling: Any) -> None:
        self.added.append(seq_id)

    def abort_request(self, seq_ids: list[str]) -> None:
        self.aborted.extend(seq_ids)

    def step(self) -> list[Any]:
        self.steps += 1
        return []


def paced_engine(budget: int, prompts: dict[str, int]) -> tuple[VllmEngine, StandInEngine]:
    engine = VllmEngine.__new__(VllmEngine)
    stand_in = StandInEngine()
    engine._engine = stand_in
    engine._sequences = {}
    engine._eos_ids = frozenset()
    engine._max_prefill_tokens = budget
    engine._pending = OrderedDict((seq, ([1] * length, None)) for seq, length in prompts.items())
    return engine, stand_in


def test_each_step_hands_over_whole_prompts_up_to_the_budget() -> None:
    engine, vllm = paced_engine(100, {"a": 60, "b": 40, "c": 30, "d": 80, "e": 10})
    engine.step()
    assert vllm.added == ["a", "b"] and vllm.steps == 1
    engine.step()
    assert vllm.added == ["a", "b", "c"]  # d would pass the budget: it waits, e behind it
    engine.step()
    assert vllm.added == ["a", "b", "c", "d", "e"]


def test_a_prompt_longer_than_the_budget_goes_alone() -> None:
    engine, vllm = paced_engine(100, {"long": 250, "short": 5})
    engine.step()
    assert vllm.added == ["long"]
    engine.step()
    assert vllm.added == ["long", "short"]


def test_removing_a_pending_prompt_drops_it_without_an_abort() -> None:
    engine, vllm = paced_engine(10, {"a": 10, "b": 10})
    engine.step()
    engine.remove("b")
    engine.remove("a")
    engine.step()
    assert vllm.added == ["a"] and vllm.aborted == ["a"]
