"""A follow-up turn's time to first token with the transformers engine's prefix cache.

The worker's engine in-process (no Redis, no HTTP), one request at a time, on the 0.5B
shape with Qwen's tokenizer: each conversation opens with about `--history-tokens` tokens
(its own system message, so conversations share nothing), gets a short reply, then a
follow-up adds about `--turn-tokens` new tokens. For an engine with the cache off (every
turn prefilled whole, as before the cache) and one with it on, it prints the follow-up's
TTFT against a cold prompt of the follow-up's length (a conversation never seen), p50 and
p90, with the prompt tokens the cache served, and the load average the run saw.

    .venv/bin/python -m bench.probes.prefix_cache [--conversations 6] [--history-tokens 1200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import ensure_model, log, make_conversations
from tokenrelay.shared.generation import ChatMessage
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.transformers_engine import TransformersEngine

_TURN = "Now say that again in other words, and add what you left out the first time"


@dataclass(frozen=True)
class Turn:
    kind: str  # "cold" or "follow-up"
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.prefix_cache")
    parser.add_argument("--shape", default="qwen2-0.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--history-tokens", type=int, default=1200)
    parser.add_argument("--turn-tokens", type=int, default=50)
    parser.add_argument("--reply-tokens", type=int, default=16)
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument(
        "--engines", default="off,on", help="the cache off (every turn prefilled), on, or both"
    )
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/bench"))
    args = parser.parse_args()
    model_dir = ensure_model(args.cache_dir.resolve(), args.shape)
    load_before = os.getloadavg()
    results: dict[str, list[Turn]] = {}
    budgets = {"off": 0, "on": 1 << 30}
    for name in args.engines.split(","):
        label, budget = f"cache {name}", budgets[name]
        engine = TransformersEngine(
            str(model_dir),
            "cpu",
            args.dtype,
            prefix_cache_bytes=budget,
            prefix_block_tokens=args.block_tokens,
        )
        _conversation(engine, args, "warm-up", 0, history_tokens=128)
        results[label] = [
            turn
            for i in range(args.conversations)
            for turn in _conversation(engine, args, label, i)
        ]
        log(f"{label}: {_summary(results[label])}")
    print(_table(results, args, load_before, os.getloadavg()))
    return 0


def _conversation(
    engine: TransformersEngine,
    args: argparse.Namespace,
    tag: str,
    index: int,
    history_tokens: int | None = None,
) -> list[Turn]:
    """An opening, its follow-up, then a cold prompt of the follow-up's length."""
    history = history_tokens or args.history_tokens
    [opening] = make_conversations(1, history, f"{tag}-{index}", engine.tokenizer)
    messages = [ChatMessage(role=m["role"], content=m["content"]) for m in opening]
    _, reply = _run(engine, engine.encode_chat(messages), "opening", args.reply_tokens)
    turn_ids = engine.tokenizer.encode((_TURN + ". ") * args.turn_tokens)[: args.turn_tokens]
    follow_up_ids = engine.encode_chat(
        [
            *messages,
            ChatMessage(role="assistant", content=_text(engine, reply)),
            ChatMessage(role="user", content=_text(engine, turn_ids)),
        ]
    )
    follow_up, _ = _run(engine, follow_up_ids, "follow-up", args.reply_tokens)
    [cold_chat] = make_conversations(1, len(follow_up_ids), f"{tag}-cold-{index}", engine.tokenizer)
    cold_messages = [ChatMessage(role=m["role"], content=m["content"]) for m in cold_chat]
    cold, _ = _run(engine, engine.encode_chat(cold_messages), "cold", args.reply_tokens)
    return [follow_up, cold]


def _text(engine: TransformersEngine, ids: list[int]) -> str:
    text = engine.tokenizer.decode(ids)
    assert isinstance(text, str)
    return text


def _run(
    engine: TransformersEngine, ids: list[int], kind: str, tokens: int
) -> tuple[Turn, list[int]]:
    """Run one sequence alone to its end; its TTFT (add to first token) and tokens."""
    params = SamplingParams(tokens, tokens, temperature=0, top_p=1, top_k=0, seed=None)
    started = time.perf_counter()
    engine.add(kind, ids, params)
    first_at, cached, produced = 0.0, 0, []
    while True:
        for output in engine.step():
            cached += output.cached_tokens
            if output.token_id is not None:
                first_at = first_at or time.perf_counter()
                produced.append(output.token_id)
            if output.finish_reason is not None:
                return Turn(kind, len(ids), cached, first_at - started), produced


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _summary(turns: list[Turn]) -> str:
    return ", ".join(
        f"{kind} p50 {statistics.median(t.ttft_s for t in turns if t.kind == kind) * 1000:.0f} ms"
        for kind in ("follow-up", "cold")
    )


def _table(
    results: dict[str, list[Turn]],
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    lines = [
        f"{args.conversations} conversations on {args.shape} ({args.dtype}, CPU, in-process "
        f"engine, one request at a time): ~{args.history_tokens}-token openings, follow-ups "
        f"adding ~{args.turn_tokens} tokens, cold prompts of the follow-up's length; "
        f"block {args.block_tokens} tokens. Load average (1, 5, 15 min) "
        f"{_load(load_before)} before, {_load(load_after)} after.",
        "",
        "| engine | turn | prompt tokens | cached tokens | TTFT p50 ms | TTFT p90 ms "
        "| p50 vs cold p50 (same engine) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, turns in results.items():
        cold_p50 = statistics.median(t.ttft_s for t in turns if t.kind == "cold")
        for kind in ("cold", "follow-up"):
            chosen = [t for t in turns if t.kind == kind]
            ttfts = [t.ttft_s for t in chosen]
            lines.append(
                f"| {label} | {kind} | {statistics.mean(t.prompt_tokens for t in chosen):.0f} "
                f"| {statistics.mean(t.cached_tokens for t in chosen):.0f} "
                f"| {statistics.median(ttfts) * 1000:.0f} | {_percentile(ttfts, 0.9) * 1000:.0f} "
                f"| {statistics.median(ttfts) / cold_p50:.2f}x |"
            )
    return "\n".join(lines)


def _load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{value:.2f}" for value in load)


if __name__ == "__main__":
    sys.exit(main())
