"""A follow-up turn reuses its history's KV on the worker, and its usage says so: chat and
completions, streamed and not, the job record and the API's metrics, through real
processes (`tokenrelay api`, `tokenrelay worker` with its prefix cache on by default, the
tiny model) and the official `openai` client."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tests.support.metrics import parse, value

HISTORY: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse. " * 8},
    {"role": "user", "content": "Tell me about the sea and its tides, please. " * 4},
    {"role": "assistant", "content": "The sea rises and falls twice a day. " * 4},
]
BLOCK = 16  # TOKENRELAY_PREFIX_CACHE_BLOCK_TOKENS's default


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster({"TOKENRELAY_MAX_INFLIGHT": "4"})


def cached_tokens(usage: object) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    assert details is not None
    return int(details.cached_tokens)


def test_a_chat_follow_up_reports_its_cached_prompt_tokens_and_replies_the_same(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    turn: list[ChatCompletionMessageParam] = [
        *HISTORY,
        {"role": "user", "content": "And the moon?"},
    ]
    first = client.chat.completions.create(
        model=MODEL_NAME,
        messages=turn,
        max_tokens=12,
        temperature=0,
    )
    assert first.usage is not None and cached_tokens(first.usage) == 0
    prompt_tokens = first.usage.prompt_tokens
    again = client.chat.completions.create(
        model=MODEL_NAME,
        messages=turn,
        max_tokens=12,
        temperature=0,
    )
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage is not None
    assert cached_tokens(again.usage) == (prompt_tokens - 1) // BLOCK * BLOCK > 0
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=turn,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None and cached_tokens(usage) == cached_tokens(again.usage)
    record = http.get(f"/v1/jobs/{chunks[0].id.removeprefix('chatcmpl-')}").json()
    assert record["usage"]["cached_tokens"] == cached_tokens(usage)


def test_a_completion_sharing_a_prefix_reports_it_streamed_and_not(client: openai.OpenAI) -> None:
    opening = "A long opening that several prompts share, word after word after word. " * 4
    first = client.completions.create(
        model=MODEL_NAME, prompt=opening + "First.", max_tokens=6, temperature=0
    )
    assert first.usage is not None and cached_tokens(first.usage) == 0
    whole = client.completions.create(
        model=MODEL_NAME, prompt=opening + "Second.", max_tokens=6, temperature=0
    )
    assert whole.usage is not None and cached_tokens(whole.usage) >= BLOCK
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=opening + "Second.",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    usage = chunks[-1].usage
    assert usage is not None and cached_tokens(usage) >= cached_tokens(whole.usage)


def test_the_api_counts_prompt_tokens_served_from_cache_and_prefilled(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    def served() -> tuple[float, float]:
        samples = parse(http.get("/metrics").text)[1]
        cache = value(samples, "tokenrelay_prompt_tokens_served_total", source="cache") or 0.0
        prefill = value(samples, "tokenrelay_prompt_tokens_served_total", source="prefill")
        return cache, prefill or 0.0

    turn: list[ChatCompletionMessageParam] = [
        *HISTORY,
        {"role": "user", "content": "What about storms?"},
    ]
    client.chat.completions.create(
        model=MODEL_NAME,
        messages=turn,
        max_tokens=4,
        temperature=0,
    )
    cache_before, prefill_before = served()
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=turn,
        max_tokens=4,
        temperature=0,
    )
    assert reply.usage is not None
    cache, prefill = served()
    hit = cached_tokens(reply.usage)
    assert hit > 0
    assert (cache - cache_before, prefill - prefill_before) == (
        hit,
        reply.usage.prompt_tokens - hit,
    )
