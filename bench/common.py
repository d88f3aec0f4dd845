"""What more than one benchmark uses: the progress log, the model checkpoints, the prompts, a
best-of timer and a pub/sub subscriber that drains what Redis publishes.

Models are random-weight Qwen2 checkpoints from `tokenrelay.worker.devmodels.tiny`, built once
into a cache folder. The "qwen2-0.5b" shape keeps Qwen2-0.5B-Instruct's 151,936 embedding
rows and gets Qwen's real tokenizer (151,643 tokens); the benchmark copy zeroes the few
embedding rows past the tokenizer (tied to the output head, so their logits are 0 and never
reach the top 20), so every sampled id decodes to text. Shapes and compute stay exactly
those of Qwen2-0.5B-Instruct.
"""

from __future__ import annotations

import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_READY_MARKER = ".bench-ready"
_EMBEDDING = "model.embed_tokens.weight"
_TEXT = (
    "The quick brown fox jumps over the lazy dog while a serving gateway queues requests, "
    "batches them and streams tokens back to every client. Please summarize the following "
    "article in three bullet points, translate it into French and write a haiku about rain. "
    "你好，世界！今天天气很好，我们一起去公园散步吧。Numbers: 0 1 2 3 42 100 2024 3.14159."  # noqa: RUF001
)
_WORDS = _TEXT.split()


def best_of(work: Callable[[], object], repeats: int = 5) -> float:
    """The least wall time `work()` took over `repeats` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def log(message: str) -> None:
    """Progress goes to stderr; stdout carries only the table."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_model(cache_dir: Path, shape: str) -> Path:
    """The benchmark checkpoint of `shape` under `cache_dir`, built on first use.

    "qwen2-0.5b" gets Qwen's real tokenizer (our ChatML template kept), which covers the
    shape's vocabulary but for its last rows: every sampled id is text, so time to first
    text means what it does with the real model. The tiny shapes keep the trained one."""
    qwen = shape == "qwen2-0.5b"
    target = cache_dir / (f"{shape}-qwen-tokenizer" if qwen else shape)
    if (target / _READY_MARKER).exists():
        return target
    from tokenrelay.worker.devmodels.tiny import build_tiny_model  # imports torch

    log(f"building the {shape} checkpoint into {target}")
    shutil.rmtree(target, ignore_errors=True)
    build_tiny_model(target, shape=shape, tokenizer_name="qwen" if qwen else "trained")
    if qwen:  # the only shape with more embedding rows than tokens
        _confine_to_tokenizer(target)
    (target / _READY_MARKER).write_text("built by bench/common.py\n")
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


def drain(
    port: int, channels: list[str], stop: threading.Event, *, subscribe: str = "SUBSCRIBE"
) -> None:
    """Subscribe to `channels` (`subscribe`: SUBSCRIBE, or SSUBSCRIBE on a cluster node) and
    read and discard every message until `stop`, as an API's hub connection reads them."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        parts = [subscribe, *channels]
        command = f"*{len(parts)}\r\n" + "".join(f"${len(p)}\r\n{p}\r\n" for p in parts)
        sock.sendall(command.encode())
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                sock.recv(1 << 20)
            except TimeoutError:
                continue
