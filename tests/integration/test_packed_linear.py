"""The bfloat16 CPU fast path: oneDNN's prepacked linears against torch's plain bf16 path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tokenrelay.shared.generation import ChatMessage
from tokenrelay.worker.engines.packed_linear import PackedLinear, can_pack
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.transformers_engine import TransformersEngine

pytestmark = pytest.mark.skipif(
    not can_pack("cpu", torch.bfloat16), reason="this CPU's oneDNN has no bfloat16 path"
)

GREEDY = SamplingParams(max_tokens=24, min_tokens=24, temperature=0, top_p=1, top_k=0, seed=None)
SEEDED = SamplingParams(max_tokens=24, min_tokens=24, temperature=0.7, top_p=0.8, top_k=20, seed=3)
PROMPTS = ("hello there", "你好, 世界 🚀 a longer prompt than the first", "short")
#: Largest logit difference allowed between the two paths: a few bfloat16 steps (1/128
#: relative) of the tiny model's logits, which stay within about 1 in magnitude.
LOGIT_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> dict[str, TransformersEngine]:
    return {
        name: TransformersEngine(str(tiny_model_dir), "cpu", "bfloat16", pack_bf16=pack)
        for name, pack in (("packed", True), ("plain", False))
    }


def decode(engine: TransformersEngine, params: SamplingParams) -> dict[str, list[int]]:
    """Every prompt's tokens, the prompts decoding together in one batch."""
    for i, prompt in enumerate(PROMPTS):
        engine.add(str(i), engine.encode_chat([ChatMessage(role="user", content=prompt)]), params)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    for _ in range(100):
        outputs = engine.step()
        if not outputs:
            return tokens
        for output in outputs:
            if output.token_id is not None:
                tokens[output.seq_id].append(output.token_id)
    raise AssertionError("the batch did not finish in 100 steps")


def test_a_bfloat16_model_on_this_cpu_runs_every_linear_packed(
    engines: dict[str, TransformersEngine], tiny_model_dir: Path
) -> None:
    packed = engines["packed"].model
    linears = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == []
    assert engines["packed"].packed_linears == 2 * 7 + 1  # 2 layers x 7 projections + head
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 15
    assert engines["plain"].packed_linears == 0
    assert TransformersEngine(str(tiny_model_dir), "cpu", "float32").packed_linears == 0


def test_packed_logits_stay_within_bfloat16_rounding_of_the_plain_path(
    engines: dict[str, TransformersEngine],
) -> None:
    ids = torch.tensor([engines["plain"].encode_chat([ChatMessage(role="user", content="hi")])])
    with torch.inference_mode():
        logits = {name: e.model(input_ids=ids).logits.float() for name, e in engines.items()}
    difference = (logits["packed"] - logits["plain"]).abs().max().item()
    assert logits["plain"].abs().max().item() > 0
    assert difference <= LOGIT_TOLERANCE


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_packed_and_plain_bfloat16_give_the_same_tokens(
    engines: dict[str, TransformersEngine], params: SamplingParams
) -> None:
    packed, plain = decode(engines["packed"], params), decode(engines["plain"], params)
    assert all(len(tokens) == 24 for tokens in plain.values())
    assert packed == plain
