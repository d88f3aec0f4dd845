"""The models and prompts the throughput benchmark runs on, and its dtype probe.

Models are random-weight Qwen2 checkpoints from `worker.tiny_model`, built once into a cache
folder. The "qwen2-0.5b" shape keeps Qwen2-0.5B-Instruct's 151,936 embedding rows, but its
benchmark tokenizer knows only ~1,250 tokens: with random weights, ~99% of sampled ids then
decode to nothing, and a stream never shows text. The benchmark copy therefore zeroes the
embedding rows past the tokenizer (tied to the output head, so their logits are 0 and never
reach the top 20). Shapes and compute stay exactly those of Qwen2-0.5B-Instruct.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.tiny_model import build_tiny_model

_READY_MARKER = ".bench-ready"
_EMBEDDING = "model.embed_tokens.weight"
_TEXT = (
    "The quick brown fox jumps over the lazy dog while a serving gateway queues requests, "
    "batches them and streams tokens back to every client. Please summarize the following "
    "article in three bullet points, translate it into French and write a haiku about rain. "
    "你好，世界！今天天气很好，我们一起去公园散步吧。Numbers: 0 1 2 3 42 100 2024 3.14159."  # noqa: RUF001
)
_WORDS = _TEXT.split()


def log(message: str) -> None:
    """Progress goes to stderr; stdout carries only the table."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_model(cache_dir: Path, shape: str) -> Path:
    """The benchmark checkpoint of `shape` under `cache_dir`, built on first use."""
    target = cache_dir / shape
    if (target / _READY_MARKER).exists():
        return target
    log(f"building the {shape} checkpoint into {target}")
    shutil.rmtree(target, ignore_errors=True)
    build_tiny_model(target, shape=shape)
    if shape != "tiny":
        _confine_to_tokenizer(target)
    (target / _READY_MARKER).write_text("built by bench/throughput_setup.py\n")
    return target


def _confine_to_tokenizer(model_dir: Path) -> None:
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer

    known = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size()
    weights_file = model_dir / "model.safetensors"
    weights = load_file(str(weights_file))
    weights[_EMBEDDING][known:] = 0
    save_file(weights, str(weights_file), metadata={"format": "pt"})


def make_conversations(n: int, prompt_tokens: int, tag: str, tokenizer: Any) -> list[list[dict]]:
    """`n` distinct chats of about `prompt_tokens` tokens each (chat template included).

    Each starts with its own system message, so no two share a prefix page and prefix
    caching cannot flatter time to first token.
    """
    conversations = []
    for i in range(n):
        system = f"Request {tag}-{i}. You are a helpful assistant."
        words: list[str] = []
        start = (i * 7) % len(_WORDS)
        while True:
            words.append(_WORDS[(start + len(words)) % len(_WORDS)])
            chat = [
                {"role": "system", "content": system},
                {"role": "user", "content": " ".join(words)},
            ]
            ids = tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            if len(ids) >= prompt_tokens:
                break
        conversations.append(chat)
    return conversations


@dataclass(frozen=True)
class DtypeProbe:
    """Aggregate tokens/s of the tokenrelay engine, in-process, per dtype."""

    tokens_per_s: dict[str, float]

    @property
    def fastest(self) -> str:
        return max(self.tokens_per_s, key=lambda dtype: self.tokens_per_s[dtype])


def probe_dtype(
    model_dir: Path,
    prompt_tokens: int,
    requests: int,
    new_tokens: int,
    repeats: int,
    before_each: Callable[[], None] = lambda: None,
) -> DtypeProbe:
    """Time `requests` sequences x `new_tokens` through `TransformersEngine` (the engine the
    worker runs, without Redis or HTTP) in float32 and bfloat16, rounds alternating between
    the two; the median of `repeats` rounds after one warm-up round each."""
    from worker.transformers_engine import TransformersEngine

    engines = {
        dtype: TransformersEngine(str(model_dir), device="cpu", dtype=dtype)
        for dtype in ("float32", "bfloat16")
    }
    rates: dict[str, list[float]] = {dtype: [] for dtype in engines}
    for repeat in range(repeats + 1):
        for dtype, engine in engines.items():
            before_each()
            rate = _engine_rate(engine, prompt_tokens, requests, new_tokens, f"{dtype}-{repeat}")
            if repeat:
                rates[dtype].append(rate)
                log(f"dtype probe: {dtype} {rate:.1f} tokens/s")
    return DtypeProbe({dtype: statistics.median(r) for dtype, r in rates.items()})


def _engine_rate(
    engine: Any, prompt_tokens: int, requests: int, new_tokens: int, tag: str
) -> float:
    from shared.generation import ChatMessage
    from worker.engine import SamplingParams

    temperature, top_p, top_k = engine.sampling_defaults()
    params = SamplingParams(new_tokens, new_tokens, temperature, top_p, top_k, seed=0)
    chats = make_conversations(requests, prompt_tokens, f"probe-{tag}", engine.tokenizer)
    prompts = [
        engine.encode_chat([ChatMessage(role=m["role"], content=m["content"]) for m in chat])
        for chat in chats
    ]
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add(f"{tag}-{i}", prompt, params)
    produced = 0
    while outputs := engine.step():
        produced += sum(1 for output in outputs if output.token_id is not None)
    return produced / (time.perf_counter() - started)
