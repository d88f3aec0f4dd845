"""Redis connections per API process and per worker stay within their pool settings
(`TOKENRELAY_REDIS_POOL_SIZE`, `TOKENRELAY_WORKER_REDIS_POOL_SIZE`) under a burst of streams
ten times larger than the pools: the API's streams share one pub/sub connection and a
bounded pool, the worker's job threads two bounded pools. Counted with `CLIENT LIST`
throughout the burst, each connection matched to the process that owns its socket."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter

import httpx
import psutil
import redis

from tests.support.cluster import MODEL_NAME, ClusterFactory, synthetic_engine
from tokenrelay.shared.redis import keys

API_POOL = 4
WORKER_POOL = 4
STREAMS = 48
TOKENS = 30
RUN_TIMEOUT_S = 90.0


def _connections_by_pid(client: redis.Redis, redis_port: int, pids: list[int]) -> Counter[int]:
    pid_of_port: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == redis_port:
                    pid_of_port[conn.laddr.port] = pid
    counts: Counter[int] = Counter()
    for entry in client.client_list():
        port = int(str(entry["addr"]).rsplit(":", 1)[1])
        if port in pid_of_port:
            counts[pid_of_port[port]] += 1
    return counts


async def _stream(client: httpx.AsyncClient, index: int) -> str:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": f"stream {index}"}],
        "max_tokens": TOKENS,
        "stream": True,
    }
    chunks = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            chunks.append(line)
    return "\n".join(chunks)


async def _burst(base_url: str) -> list[str]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:
        return await asyncio.wait_for(
            asyncio.gather(*(_stream(client, i) for i in range(STREAMS))), RUN_TIMEOUT_S
        )


def test_a_burst_of_streams_keeps_redis_connections_within_the_pool_sizes(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster(
        {
            **synthetic_engine(20),
            "TOKENRELAY_WORKER_CONCURRENCY": str(STREAMS),
            "TOKENRELAY_MAX_INFLIGHT": str(STREAMS),
            "TOKENRELAY_REDIS_POOL_SIZE": str(API_POOL),
            "TOKENRELAY_WORKER_REDIS_POOL_SIZE": str(WORKER_POOL),
        },
        api_workers=0,
    )
    api = cluster.start_api()
    (worker,) = [child for child in cluster.group.children if child.name == "worker"]
    redis_port = int(cluster.redis_url.rsplit(":", 1)[1].split("/")[0])
    most: Counter[int] = Counter()
    most_running = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal most_running
        with redis.Redis.from_url(cluster.redis_url, decode_responses=True) as client:
            while not done.is_set():
                counts = _connections_by_pid(client, redis_port, [api.pid, worker.pid])
                for pid, count in counts.items():
                    most[pid] = max(most[pid], count)
                most_running = max(most_running, client.zcard(keys.leases()))
                done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        replies = asyncio.run(_burst(cluster.base_url))
    finally:
        done.set()
        sampler.join(timeout=10)
    assert all(reply.rstrip().endswith("data: [DONE]") for reply in replies)
    assert most_running >= STREAMS // 2, "the burst never ran its streams side by side"
    # The API's async pool, its RQ client's pool and the stream hub's pub/sub connection;
    # the worker's RQ and scripts pools.
    assert 0 < most[api.pid] <= 2 * API_POOL + 1, most
    assert 0 < most[worker.pid] <= 2 * WORKER_POOL, most
