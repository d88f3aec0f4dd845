"""Memory per request is bounded: `MAX_REQUEST_BYTES`-sized prompts arriving 8 and 32 at once raise
a real API process's peak RSS by less than `PEAK_BOUND_MB` (docs/operations/memory.md), whether the
byte count alone refuses them or they must be tokenized.

RSS is read from /proc (peak: `VmHWM`, reset between runs through `clear_refs`); nothing here is
timed (a short chat's latency is printed). The figures are printed (`pytest -s`) for the docs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory

MAX_REQUEST_BYTES = 1_048_576
#: Below what the tiny model's byte bound refuses untokenized (2048 tokens, 252 bytes per token).
TOKENIZED_CHARS = 380_000
PEAK_BOUND_MB = 300


@pytest.fixture
def cluster(make_cluster: ClusterFactory) -> Cluster:
    return make_cluster({"TOKENRELAY_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)})


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def body(chars: int) -> dict[str, object]:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "a" * chars}]}


async def send_at_once(cluster: Cluster, chars: int, count: int) -> list[httpx.Response]:
    """`count` prompts of `chars` at once, and a short chat among them whose latency is
    printed (not asserted)."""
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=120) as client:

        async def short_chat() -> None:
            await asyncio.sleep(0.05)  # once the big bodies are on their way
            started = time.monotonic()
            short = body(2) | {"max_tokens": 1}
            assert (await client.post("/v1/chat/completions", json=short)).status_code == 200
            print(f"\n  a short chat meanwhile: {(time.monotonic() - started) * 1000:.0f} ms")

        requests = [client.post("/v1/chat/completions", json=body(chars)) for _ in range(count)]
        *responses, _ = await asyncio.gather(*requests, short_chat())
        return responses


@pytest.mark.parametrize("count", [8, 32])
def test_concurrent_max_size_prompts_keep_the_api_rss_bounded(cluster: Cluster, count: int) -> None:
    pid = cluster.group.children[-1].pid
    assert cluster.group.children[-1].name == "api"
    full = MAX_REQUEST_BYTES - 200
    warm = asyncio.run(send_at_once(cluster, TOKENIZED_CHARS, 1))  # loads the tokenizer
    assert warm[0].json()["error"]["code"] == "context_length_exceeded"
    baseline = status_mb(pid, "VmRSS")
    for chars in (full, TOKENIZED_CHARS):
        reset_peak(pid)
        responses = asyncio.run(send_at_once(cluster, chars, count))
        codes = {r.json()["error"]["code"] for r in responses}
        assert codes == {"context_length_exceeded"}, codes
        peak, after = status_mb(pid, "VmHWM"), status_mb(pid, "VmRSS")
        print(
            f"\n{count} x {chars} chars: RSS baseline {baseline:.0f} MB, peak {peak:.0f} MB "
            f"(+{peak - baseline:.0f}), after {after:.0f} MB (+{after - baseline:.0f})"
        )
        assert peak - baseline < PEAK_BOUND_MB
