"""The batched transformers engine on the tiny Qwen2: joining, leaving, per-row determinism."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tokenrelay.shared.errors import GenerationFailed, InvalidRequest
from tokenrelay.shared.generation import ChatMessage
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.transformers_engine import TransformersEngine

GREEDY = SamplingParams(max_tokens=24, min_tokens=24, temperature=0, top_p=1, top_k=0, seed=None)
SEEDED = SamplingParams(max_tokens=24, min_tokens=24, temperature=1.0, top_p=0.9, top_k=20, seed=7)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> TransformersEngine:
    return TransformersEngine(str(tiny_model_dir), device="cpu")


def run(
    engine: TransformersEngine, jobs: list[tuple[str, str, SamplingParams, int]]
) -> tuple[dict[str, list[int]], list[int]]:
    """Run jobs (id, prompt, params, step at which it joins); return tokens and batch sizes."""
    tokens: dict[str, list[int]] = {job_id: [] for job_id, *_ in jobs}
    finished: set[str] = set()
    batch_sizes: list[int] = []
    step = 0
    while len(finished) < len(jobs):
        for job_id, prompt, params, join_at in jobs:
            if join_at == step:
                ids = engine.encode_chat([ChatMessage(role="user", content=prompt)])
                engine.add(job_id, ids, params)
        outputs = engine.step()
        batch_sizes.append(len(outputs))
        for output in outputs:
            if output.token_id is not None:
                tokens[output.seq_id].append(output.token_id)
            if output.finish_reason is not None:
                finished.add(output.seq_id)
        step += 1
        assert step < 500
    return tokens, batch_sizes


def test_a_job_gives_the_same_tokens_alone_and_in_a_changing_batch(
    engine: TransformersEngine,
) -> None:
    alone_greedy, _ = run(engine, [("a", "hello there", GREEDY, 0)])
    alone_seeded, _ = run(
        engine, [("b", "你好, 世界 🚀 a longer prompt than the first", SEEDED, 0)]
    )
    shared, sizes = run(
        engine,
        [
            ("x", "a prompt that starts first", GREEDY, 0),
            ("a", "hello there", GREEDY, 3),
            ("b", "你好, 世界 🚀 a longer prompt than the first", SEEDED, 7),
            ("y", "short", SEEDED, 7),
        ],
    )
    assert shared["a"] == alone_greedy["a"]
    assert shared["b"] == alone_seeded["b"]
    assert max(sizes) == 4


def test_jobs_join_at_any_step_and_leave_when_done(engine: TransformersEngine) -> None:
    short = SamplingParams(max_tokens=5, min_tokens=5, temperature=0, top_p=1, top_k=0, seed=None)
    tokens, sizes = run(engine, [("long", "a", GREEDY, 0), ("short", "b", short, 2)])
    assert len(tokens["long"]) == 24 and len(tokens["short"]) == 5
    assert sizes[2] == 1, "step 2 prefills the joiner alone"
    assert 2 in sizes[3:8]
    assert sizes[-1] == 1, "the short job's row was freed when it finished"


def test_prefill_and_decode_alternate_while_jobs_keep_joining(
    engine: TransformersEngine,
) -> None:
    jobs = [("running", "a", GREEDY, 0)] + [(f"j{i}", "b", GREEDY, i) for i in range(1, 4)]
    _, sizes = run(engine, jobs)
    # step 0 prefills "running"; j1 (added at step 1) waits for a decode of "running", then
    # joins with j2 in one prefill; j3 (added at step 3) waits for a decode of all three.
    assert sizes[:6] == [1, 1, 2, 3, 1, 4]


LONG_PROMPT = "a long prompt, prefilled in several chunks: 你好, 世界 🚀 " * 3


def test_a_prompt_prefilled_in_chunks_gives_the_same_tokens(
    engine: TransformersEngine, tiny_model_dir: Path
) -> None:
    chunked = TransformersEngine(str(tiny_model_dir), device="cpu", max_prefill_tokens=8)
    prompt_tokens = len(chunked.encode_chat([ChatMessage(role="user", content=LONG_PROMPT)]))
    assert prompt_tokens > 3 * 8
    for params in (GREEDY, SEEDED):
        whole, _ = run(engine, [("long", LONG_PROMPT, params, 0)])
        chunks, sizes = run(chunked, [("long", LONG_PROMPT, params, 0)])
        assert chunks == whole
        assert sizes[:3] == [0, 0, 0], "no token until the last chunk is in"


def test_long_prompts_and_many_joiners_never_stall_the_batch(tiny_model_dir: Path) -> None:
    short = "hi"
    short_tokens = len(
        TransformersEngine(str(tiny_model_dir), device="cpu").encode_chat(
            [ChatMessage(role="user", content=short)]
        )
    )
    budget = 2 * short_tokens + 1  # two short prompts share a prefill step, three do not
    engine = TransformersEngine(str(tiny_model_dir), device="cpu", max_prefill_tokens=budget)
    long_tokens = len(engine.encode_chat([ChatMessage(role="user", content=LONG_PROMPT)]))
    chunks = -(-long_tokens // budget)
    assert chunks >= 2
    jobs = [("running", short, GREEDY, 0), ("long", LONG_PROMPT, GREEDY, 1)]
    _, sizes = run(engine, jobs)
    # Each chunk but the last gives no token; a decode of "running" follows every chunk.
    expected = [1, 1] + [0, 1] * (chunks - 1) + [1, 2]
    assert sizes[: len(expected)] == expected
    shorts = [(f"s{i}", short, GREEDY, 0) for i in range(3)]
    _, sizes = run(engine, shorts)
    assert sizes[:3] == [2, 2, 1], "two share a prefill, a decode of both, then the third"


def test_removed_job_frees_its_row_at_once(engine: TransformersEngine) -> None:
    ids = engine.encode_chat([ChatMessage(role="user", content="x")])
    engine.add("p", ids, GREEDY)
    engine.add("q", ids, GREEDY)
    assert len(engine.step()) == 2
    engine.remove("p")
    outputs = engine.step()
    assert [o.seq_id for o in outputs] == ["q"]
    engine.remove("q")
    assert engine.step() == []


def test_eos_is_suppressed_until_min_tokens(engine: TransformersEngine) -> None:
    tokens, _ = run(engine, [("m", "hi", SEEDED, 0)])
    assert len(tokens["m"]) == SEEDED.max_tokens


def greedy(**controls: object) -> SamplingParams:
    return dataclasses.replace(GREEDY, **controls)  # type: ignore[arg-type]


def test_logit_bias_minus_100_removes_the_token_greedy_decoding_picks(
    engine: TransformersEngine,
) -> None:
    plain, _ = run(engine, [("a", "hello there", GREEDY, 0)])
    banned = plain["a"][0]
    biased, _ = run(engine, [("a", "hello there", greedy(logit_bias=((banned, -100.0),)), 0)])
    assert biased["a"][0] != banned
    assert banned not in biased["a"]


def test_penalties_change_a_repetitive_greedy_reply_inside_a_shared_batch(
    engine: TransformersEngine,
) -> None:
    plain, _ = run(engine, [("a", "hello there", greedy(max_tokens=48, min_tokens=48), 0)])
    repeats = len(plain["a"]) - len(set(plain["a"]))
    assert repeats > 0, "the greedy reply repeats tokens (what the penalties act on)"
    penalised = {
        "freq": greedy(max_tokens=48, min_tokens=48, frequency_penalty=2.0),
        "pres": greedy(max_tokens=48, min_tokens=48, presence_penalty=2.0),
        "rep": greedy(max_tokens=48, min_tokens=48, repetition_penalty=2.0),
    }
    jobs = [("a", "hello there", greedy(max_tokens=48, min_tokens=48), 0)]
    jobs += [(name, "hello there", params, 0) for name, params in penalised.items()]
    tokens, _ = run(engine, jobs)
    assert tokens["a"] == plain["a"], "a job without penalties is untouched by its neighbours"
    for name in penalised:
        assert tokens[name] != plain["a"], name
        assert len(tokens[name]) - len(set(tokens[name])) < repeats, name


def test_ignore_eos_and_stop_token_ids(engine: TransformersEngine) -> None:
    free = greedy(max_tokens=24, min_tokens=0)
    plain, _ = run(engine, [("a", "hi", free, 0)])
    stop_at = plain["a"][3]
    first = plain["a"].index(stop_at)
    stopped, _ = run(
        engine, [("a", "hi", greedy(min_tokens=0, stop_token_ids=frozenset({stop_at})), 0)]
    )
    assert stopped["a"] == plain["a"][:first]
    eos = sorted(engine._eos_ids)
    never_eos = greedy(
        max_tokens=24, min_tokens=0, ignore_eos=True, logit_bias=tuple((e, 100.0) for e in eos)
    )
    tokens, _ = run(engine, [("a", "hi", never_eos, 0)])
    assert len(tokens["a"]) == 24, "end-of-sequence, biased up, is still never sampled"


BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "colour": {"enum": ["red", "green"]},
    },
    "required": ["name", "ok", "n", "colour"],
    "additionalProperties": False,
}


def test_a_json_schema_is_enforced_per_row_and_always_closes_on_random_weights(
    engine: TransformersEngine,
) -> None:
    grammar = engine.compile_grammar(json.dumps(BOUNDED_SCHEMA))
    free = dataclasses.replace(SEEDED, max_tokens=200, min_tokens=0, temperature=1.5, top_k=0)
    jobs = [
        (f"s{seed}", f"hi {seed}", dataclasses.replace(free, seed=seed, grammar=grammar), seed)
        for seed in range(6)
    ]
    jobs.append(("plain", "hello there", GREEDY, 0))
    tokens, _ = run(engine, jobs)
    alone, _ = run(engine, [("plain", "hello there", GREEDY, 0)])
    assert tokens["plain"] == alone["plain"], "the unconstrained neighbour is untouched"
    for seed in range(6):
        text = engine.tokenizer.decode(tokens[f"s{seed}"], skip_special_tokens=True)
        document = json.loads(text)
        assert set(document) == {"name", "ok", "n", "colour"}
        assert len(document["name"]) <= 8 and isinstance(document["ok"], bool)
        assert 0 <= document["n"] <= 999 and document["colour"] in ("red", "green")
        assert len(tokens[f"s{seed}"]) < 200, "closed well before max_tokens"


def test_a_schema_the_grammar_engine_cannot_take_is_a_400(engine: TransformersEngine) -> None:
    with pytest.raises(InvalidRequest, match="response_format"):
        engine.compile_grammar(json.dumps({"type": "object", "properties": {"a": {"$ref": "#/x"}}}))


def test_a_json_job_continued_past_its_delivered_tokens_ends_as_it_would_have(
    engine: TransformersEngine,
) -> None:
    """A continuation (`worker.continuation`) prefills the delivered tokens after the prompt
    and starts its grammar past them (`continue_grammar`): a greedy JSON-schema job cut after
    `k` tokens generates exactly the rest of the uninterrupted job, which validates."""
    grammar = engine.compile_grammar(json.dumps(BOUNDED_SCHEMA))
    whole_params = dataclasses.replace(GREEDY, max_tokens=200, min_tokens=0, grammar=grammar)
    whole, _ = run(engine, [("whole", "hi", whole_params, 0)])
    document = json.loads(engine.tokenizer.decode(whole["whole"], skip_special_tokens=True))
    assert set(document) == {"name", "ok", "n", "colour"}
    k = len(whole["whole"]) // 2
    delivered = whole["whole"][:k]
    prompt = engine.encode_chat([ChatMessage(role="user", content="hi")])
    rest_params = dataclasses.replace(
        whole_params, max_tokens=200 - k, grammar=engine.continue_grammar(grammar, delivered)
    )
    engine.add("rest", prompt + delivered, rest_params)
    rest: list[int] = []
    for _ in range(300):
        outputs = engine.step()
        rest += [o.token_id for o in outputs if o.token_id is not None]
        if any(o.finish_reason is not None for o in outputs):
            break
    assert delivered + rest == whole["whole"]


def test_a_grammar_that_refuses_the_delivered_tokens_fails_the_continuation(
    engine: TransformersEngine,
) -> None:
    grammar = engine.compile_grammar(json.dumps(BOUNDED_SCHEMA))
    not_json = engine.encode_prompt("hello")
    with pytest.raises(GenerationFailed, match="refuses the tokens already delivered"):
        engine.continue_grammar(grammar, not_json)
