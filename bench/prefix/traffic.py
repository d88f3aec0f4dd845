"""The traffic of one row: interleaved multi-turn conversations, cold prompts, and distinct
prompts for throughput, each sent as a streamed chat completion with usage.

Conversations advance in rounds, turn k of every conversation before turn k+1 of any, so a
worker runs other conversations between two turns of one and placement decides whether the
next turn finds its prefix. A request's TTFT is the time from sending it to the first SSE chunk
with text; its prompt and cached tokens come from the final chunk's usage
(`prompt_tokens_details.cached_tokens`), its worker from the job record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from bench.common import make_conversations
from bench.prefix.cluster import SERVED_MODEL_NAME, PrefixCluster

REQUEST_TIMEOUT = httpx.Timeout(600.0, connect=30.0)
_TURN = (
    "Now say that again in other words, add what you left out the first time, and tell me "
    "which of the points matters most for turn"
)


class StreamFailed(RuntimeError):
    """A benchmark request was refused, or its stream carried an error."""


@dataclass(frozen=True)
class Request:
    kind: str  # "opening", "follow-up", "cold" or "distinct"
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    end_s: float
    text: str
    job_id: str


@dataclass(frozen=True)
class Prompts:
    """The run's prompts, the same for every row: each conversation's opening and the user
    turns after it, cold chats, and distinct chats for throughput."""

    openings: list[list[dict]]
    turns: list[list[str]]
    cold: list[list[dict]]
    distinct: list[list[dict]]


def make_prompts(
    tokenizer: Any,
    conversations: int,
    turns: int,
    history_tokens: int,
    turn_tokens: int,
    reply_tokens: int,
    distinct: int,
) -> Prompts:
    """Openings of ~`history_tokens` (own system message each, so conversations share no
    block), user turns of ~`turn_tokens`, and one cold chat per conversation as long as one of
    its follow-ups (turn 2, 3, ... in turn), so cold and follow-up lengths match."""
    openings = make_conversations(conversations, history_tokens, "conversation", tokenizer)
    user_turns = [
        [_turn_text(tokenizer, c, k, turn_tokens) for k in range(1, turns)]
        for c in range(conversations)
    ]
    per_turn = turn_tokens + reply_tokens + 10  # the turn, the reply, the template's markers
    cold = [
        make_conversations(
            1, history_tokens + per_turn * (1 + c % max(1, turns - 1)), f"cold-{c}", tokenizer
        )[0]
        for c in range(conversations)
    ]
    distinct_chats = make_conversations(distinct, history_tokens, "distinct", tokenizer)
    return Prompts(openings, user_turns, cold, distinct_chats)


def _turn_text(tokenizer: Any, conversation: int, turn: int, tokens: int) -> str:
    sentence = f"{_TURN} {turn + 1} of conversation {conversation}."
    text = sentence
    while len(tokenizer.encode(text)) < tokens:
        text += " " + sentence
    return text


def body(chat: list[dict], tokens: int) -> dict:
    """A streamed, greedy chat completion of exactly `tokens` tokens, with usage."""
    return {
        "model": SERVED_MODEL_NAME,
        "messages": chat,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def stream(client: httpx.Client, url: str, kind: str, chat: list[dict], tokens: int) -> Request:
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    usage: dict = {}
    job_id = ""
    with client.stream("POST", f"{url}/v1/chat/completions", json=body(chat, tokens)) as reply:
        if reply.status_code != 200:
            raise StreamFailed(f"{reply.status_code}: {reply.read()[:300]!r}")
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise StreamFailed(str(chunk["error"]))
            job_id = job_id or str(chunk.get("id", "")).removeprefix("chatcmpl-")
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first or time.perf_counter()
                    text.append(content)
    end = time.perf_counter()
    if not usage:
        raise StreamFailed("the stream ended without usage")
    details = usage.get("prompt_tokens_details") or {}
    return Request(
        kind=kind,
        prompt_tokens=int(usage["prompt_tokens"]),
        cached_tokens=int(details.get("cached_tokens") or 0),
        ttft_s=(first or end) - started,
        end_s=end,
        text="".join(text),
        job_id=job_id,
    )


@dataclass(frozen=True)
class RowTraffic:
    requests: list[Request]
    jobs_per_worker: dict[str, int]
    """Conversation and cold jobs per worker (every worker listed, 0 if it ran none)."""


def run_conversations(
    cluster: PrefixCluster,
    prompts: Prompts,
    reply_tokens: int,
    concurrency: int,
    progress: Callable[[str], None],
) -> RowTraffic:
    """Every conversation's turns, round by round (at most `concurrency` requests in flight),
    then the cold chats."""
    url = cluster.base_url
    chats = [list(opening) for opening in prompts.openings]
    requests: list[Request] = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    with (
        httpx.Client(timeout=REQUEST_TIMEOUT, limits=limits) as client,
        ThreadPoolExecutor(concurrency) as pool,
    ):
        rounds = 1 + len(prompts.turns[0]) if prompts.turns else 1
        for turn in range(rounds):
            kind = "opening" if turn == 0 else "follow-up"
            if turn:
                for chat, user_turns in zip(chats, prompts.turns, strict=True):
                    chat.append({"role": "user", "content": user_turns[turn - 1]})
            done = list(
                pool.map(
                    lambda chat, kind=kind: stream(client, url, kind, chat, reply_tokens), chats
                )
            )
            for chat, request in zip(chats, done, strict=True):
                chat.append({"role": "assistant", "content": request.text})
            requests += done
            progress(f"round {turn + 1}/{rounds}: {_ttfts(done)}")
        cold = list(
            pool.map(lambda chat: stream(client, url, "cold", chat, reply_tokens), prompts.cold)
        )
        requests += cold
        progress(f"cold: {_ttfts(cold)}")
        jobs: dict[str, int] = {}
        for request in requests:
            for worker in cluster.workers_of(request.job_id, client)[:1]:
                jobs[worker] = jobs.get(worker, 0) + 1
    return RowTraffic(requests, {name: 0 for name in cluster.worker_names} | jobs)


def run_distinct(
    cluster: PrefixCluster, prompts: Prompts, reply_tokens: int, concurrency: int
) -> float:
    """Jobs a second over the distinct chats, `concurrency` in flight (closed loop)."""
    url = cluster.base_url
    limits = httpx.Limits(max_connections=concurrency + 4)
    with (
        httpx.Client(timeout=REQUEST_TIMEOUT, limits=limits) as client,
        ThreadPoolExecutor(concurrency) as pool,
    ):
        started = time.perf_counter()
        done = list(
            pool.map(
                lambda chat: stream(client, url, "distinct", chat, reply_tokens), prompts.distinct
            )
        )
        return len(done) / (max(r.end_s for r in done) - started)


def _ttfts(requests: list[Request]) -> str:
    ttfts = sorted(r.ttft_s for r in requests)
    cached = sum(r.cached_tokens for r in requests)
    prompt = sum(r.prompt_tokens for r in requests)
    return f"TTFT median {ttfts[len(ttfts) // 2] * 1000:.0f} ms, cached {cached}/{prompt} tokens"
