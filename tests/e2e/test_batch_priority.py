"""Batch lines never cost interactive traffic its admission: while a batch holds its share of
`MAX_INFLIGHT`, the full limit of interactive streams is still admitted (none refused with
503), and their time to first token stays within 2x that of the idle cluster, same run."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import redis

from tests.e2e.test_batches import chat_line, upload, wait_for
from tests.support.cluster import MODEL_NAME, ClusterFactory
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

pytestmark = pytest.mark.timeout(300)

LIMIT = 4
ROUNDS = 3


def first_token_s(base_url: str) -> float:
    """One streamed chat completion; seconds to its first content chunk. Raises on a 503."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    with (
        httpx.Client(base_url=base_url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line:
                first = time.perf_counter() - started
    assert first is not None
    return first


def sample_held(store: redis.Redis, done: threading.Event) -> list[int]:
    """The batch's lines in flight, every 20 ms until `done` (at least once)."""
    samples = [int(store.scard(keys.batch_lines_inflight()))]
    while not done.wait(0.02):
        samples.append(int(store.scard(keys.batch_lines_inflight())))
    return samples


def interactive_round(base_url: str) -> list[float]:
    """`LIMIT` streams at once: the whole interactive allowance."""
    with ThreadPoolExecutor(LIMIT) as pool:
        return list(pool.map(lambda _: first_token_s(base_url), range(LIMIT)))


def test_interactive_streams_are_admitted_and_fast_while_a_batch_runs(
    make_cluster: ClusterFactory,
) -> None:
    settings = {
        "TOKENRELAY_MAX_INFLIGHT": str(LIMIT),
        "TOKENRELAY_BATCH_MAX_INFLIGHT_SHARE": "0.5",
        "TOKENRELAY_WORKER_CONCURRENCY": "8",
    }
    cluster = make_cluster(settings)
    store = redis.Redis.from_url(cluster.redis_url)
    try:
        idle = [t for _ in range(ROUNDS) for t in interactive_round(cluster.base_url)]
        with openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="x", max_retries=0) as client:
            lines = [chat_line(f"b-{i}", max_tokens=64, min_tokens=64) for i in range(400)]
            batch = client.batches.create(
                input_file_id=upload(client, lines),
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            busy: list[float] = []
            held: list[list[int]] = []  # per round, the batch's lines in flight, sampled
            for _ in range(ROUNDS):
                # Each round starts while the batch holds its share: the round before took
                # every slot, and the batch's lines that ended meanwhile wait for the feeder.
                eventually(
                    lambda: int(store.scard(keys.batch_lines_inflight())) == LIMIT // 2,
                    60,
                    "the batch to hold its share",
                )
                with ThreadPoolExecutor(1) as sampler:
                    done = threading.Event()
                    samples = sampler.submit(sample_held, store, done)
                    try:
                        busy += interactive_round(cluster.base_url)  # raises on any 503
                    finally:
                        done.set()
                    held.append(samples.result())
            # The batch never held more than its share, while interactive streams took the
            # whole limit.
            assert all(max(r) <= LIMIT // 2 for r in held), held
            assert client.batches.retrieve(batch.id).status == "in_progress"
            assert statistics.median(busy) <= 2 * statistics.median(idle), (idle, busy)
            client.batches.cancel(batch.id)
            wait_for(client, batch.id, {"cancelled"})
    finally:
        store.close()
