"""The transformers engine's prefix cache on the tiny Qwen2: a hit changes no reply.

Every reply with a hit is compared with the same job's reply from an engine without a
cache (greedy, so the same token ids), alone, joining a running batch, after a chunked
prefill, under a budget that evicts, and after a removal or a failure part-way through a
prefill.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenrelay.shared.generation import ChatMessage
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.transformers_engine import TransformersEngine

GREEDY = SamplingParams(max_tokens=16, min_tokens=16, temperature=0, top_p=1, top_k=0, seed=None)
BLOCK = 8
HISTORY = [
    ChatMessage(role="system", content="You answer briefly, in the user's language."),
    ChatMessage(role="user", content="a first question about a long conversation " * 4),
    ChatMessage(role="assistant", content="a first answer, somewhat long as well " * 3),
]
FOLLOW_UP = [*HISTORY, ChatMessage(role="user", content="and a follow-up question?")]
OTHER = [ChatMessage(role="user", content="an unrelated prompt 你好 🚀")]


@pytest.fixture(scope="module")
def plain(tiny_model_dir: Path) -> TransformersEngine:
    return TransformersEngine(str(tiny_model_dir), device="cpu")


def cached_engine(
    model_dir: Path, budget: int = 1 << 30, max_prefill_tokens: int = 2048
) -> TransformersEngine:
    return TransformersEngine(
        str(model_dir),
        device="cpu",
        max_prefill_tokens=max_prefill_tokens,
        prefix_cache_bytes=budget,
        prefix_block_tokens=BLOCK,
    )


Job = tuple[str, list[ChatMessage], int]


def run(engine: TransformersEngine, jobs: list[Job]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Run jobs (id, messages, step at which it joins); their tokens and cached tokens."""
    tokens: dict[str, list[int]] = {job_id: [] for job_id, *_ in jobs}
    cached: dict[str, int] = dict.fromkeys(tokens, 0)
    finished: set[str] = set()
    step = 0
    while len(finished) < len(jobs):
        for job_id, messages, join_at in jobs:
            if join_at == step:
                engine.add(job_id, engine.encode_chat(messages), GREEDY)
        for output in engine.step():
            cached[output.seq_id] += output.cached_tokens
            if output.token_id is not None:
                tokens[output.seq_id].append(output.token_id)
            if output.finish_reason is not None:
                finished.add(output.seq_id)
        step += 1
        assert step < 500
    return tokens, cached


def alone(engine: TransformersEngine, messages: list[ChatMessage]) -> list[int]:
    return run(engine, [("alone", messages, 0)])[0]["alone"]


def shared_tokens(a: list[int], b: list[int]) -> int:
    pairs = zip(a, b, strict=False)
    return next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))


def block_bytes(engine: TransformersEngine) -> int:
    config = engine.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim
    return per_token * BLOCK * engine.model.dtype.itemsize


def test_a_follow_up_reuses_the_history_and_replies_the_same(
    plain: TransformersEngine, tiny_model_dir: Path
) -> None:
    engine = cached_engine(tiny_model_dir)
    history_ids = engine.encode_chat(HISTORY)
    follow_up_ids = engine.encode_chat(FOLLOW_UP)
    first, first_cached = run(engine, [("first", HISTORY, 0)])
    assert first_cached["first"] == 0, "a new engine starts empty"
    assert first["first"] == alone(plain, HISTORY)
    assert engine.prefix_cache is not None
    assert len(engine.prefix_cache) == len(history_ids) // BLOCK
    tokens, cached = run(engine, [("next", FOLLOW_UP, 0)])
    assert tokens["next"] == alone(plain, FOLLOW_UP)
    shared = shared_tokens(history_ids, follow_up_ids)
    assert cached["next"] == shared // BLOCK * BLOCK > 0
    again, cached_again = run(engine, [("again", FOLLOW_UP, 0)])
    assert again["again"] == tokens["next"]
    assert cached_again["again"] == (len(follow_up_ids) - 1) // BLOCK * BLOCK


def test_a_hit_leaves_the_prompts_last_token_to_prefill(tiny_model_dir: Path) -> None:
    engine = cached_engine(tiny_model_dir)
    ids = engine.encode_chat(OTHER)
    whole = TransformersEngine(
        str(tiny_model_dir), device="cpu", prefix_cache_bytes=1 << 20, prefix_block_tokens=len(ids)
    )
    run(whole, [("a", OTHER, 0)])
    assert whole.prefix_cache is not None and len(whole.prefix_cache) == 1
    tokens, cached = run(whole, [("b", OTHER, 0)])
    assert cached["b"] == 0, "the prompt's one block holds its last token: no hit"
    assert len(tokens["b"]) == GREEDY.max_tokens


def test_a_hit_joining_a_running_batch_replies_as_it_does_alone(
    plain: TransformersEngine, tiny_model_dir: Path
) -> None:
    engine = cached_engine(tiny_model_dir)
    run(engine, [("warm", HISTORY, 0)])
    template_only = [ChatMessage(role="user", content="a prompt nobody sent")]
    jobs: list[Job] = [
        ("running", OTHER, 0),
        ("template-only", template_only, 3),
        ("hit", FOLLOW_UP, 3),
        ("hit-too", HISTORY, 5),
    ]
    tokens, cached = run(engine, jobs)
    # Each job hits the longest prefix it shares with the prompts prefilled before it (all
    # chats share the template's opening, a block of the tiny tokenizer's ids).
    earlier = [engine.encode_chat(HISTORY)]
    for job_id, messages, _ in jobs:
        ids = engine.encode_chat(messages)
        common = min(max(shared_tokens(ids, other) for other in earlier), len(ids) - 1)
        assert cached[job_id] == common // BLOCK * BLOCK, job_id
        earlier.append(ids)
        assert tokens[job_id] == alone(plain, messages), job_id
    assert cached["hit"] > 2 * BLOCK and cached["hit-too"] > 2 * BLOCK


def test_a_long_prompt_is_cached_chunk_by_chunk_and_reused(
    plain: TransformersEngine, tiny_model_dir: Path
) -> None:
    engine = cached_engine(tiny_model_dir, max_prefill_tokens=2 * BLOCK)
    ids = engine.encode_chat(FOLLOW_UP)
    assert len(ids) > 4 * 2 * BLOCK
    engine.add("long", ids, GREEDY)
    assert engine.step() == []
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == 2
    engine.remove("long")  # cancelled after one chunk: its complete blocks stay, no more
    assert len(engine.prefix_cache) == 2
    expected = alone(plain, FOLLOW_UP)
    tokens, cached = run(engine, [("resumed", FOLLOW_UP, 0)])
    assert cached["resumed"] == 2 * BLOCK
    assert tokens["resumed"] == expected
    assert len(engine.prefix_cache) == len(ids) // BLOCK
    tokens, cached = run(engine, [("running", OTHER, 0), ("again", FOLLOW_UP, 1)])
    assert cached["again"] == (len(ids) - 1) // BLOCK * BLOCK
    assert tokens["again"] == expected
    assert tokens["running"] == alone(plain, OTHER)


def test_eviction_under_a_tiny_budget_keeps_replies_exact(
    plain: TransformersEngine, tiny_model_dir: Path
) -> None:
    probe = cached_engine(tiny_model_dir, budget=1)
    budget = 5 * block_bytes(probe)
    engine = cached_engine(tiny_model_dir, budget=budget)
    assert engine.prefix_cache is not None
    prompts = [HISTORY, OTHER, FOLLOW_UP, HISTORY, OTHER, FOLLOW_UP]
    for i, messages in enumerate(prompts):
        tokens, cached = run(engine, [(f"j{i}", messages, 0)])
        assert tokens[f"j{i}"] == alone(plain, messages), i
        assert engine.prefix_cache.bytes_used <= budget
        assert len(engine.prefix_cache) <= 5
    # The last prompt stored its first five blocks (eviction ate the deepest ones first),
    # so it hits them now.
    _, cached = run(engine, [("last", FOLLOW_UP, 0)])
    assert cached["last"] == 5 * BLOCK
    assert probe.prefix_cache is not None
    run(probe, [("too-big", HISTORY, 0)])
    assert len(probe.prefix_cache) == 0, "a block larger than the budget is never kept"


def test_a_prefill_that_fails_part_way_leaves_the_cache_as_it_was(
    plain: TransformersEngine, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = cached_engine(tiny_model_dir)
    assert engine.prefix_cache is not None
    run(engine, [("warm", HISTORY, 0)])
    before = {key: block.clone() for key, block in engine.prefix_cache._blocks.items()}
    last_layer = engine.model.model.layers[-1]

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the device failed")

    monkeypatch.setattr(last_layer, "forward", fail)
    engine.add("doomed", engine.encode_chat(FOLLOW_UP), GREEDY)
    with pytest.raises(RuntimeError, match="the device failed"):
        engine.step()
    engine.remove("doomed")  # as the batcher does with a failed step's jobs
    monkeypatch.undo()
    after = engine.prefix_cache._blocks
    assert after.keys() == before.keys()
    assert all(torch.equal(after[key], block) for key, block in before.items())
    tokens, cached = run(engine, [("next", FOLLOW_UP, 0)])
    assert cached["next"] > 0
    assert tokens["next"] == alone(plain, FOLLOW_UP)


def test_jobs_of_another_namespace_never_match(tiny_model_dir: Path) -> None:
    engine = cached_engine(tiny_model_dir)
    assert engine.prefix_cache is not None
    ids = engine.encode_chat(HISTORY)
    run(engine, [("warm", HISTORY, 0)])
    assert len(engine.prefix_cache.match(engine.prefix_cache.hashes(ids))) > 0
    engine.prefix_cache.namespace = "another-model|torch.float32"
    assert engine.prefix_cache.match(engine.prefix_cache.hashes(ids)) == []
    _, cached = run(engine, [("other", HISTORY, 0)])
    assert cached["other"] == 0
