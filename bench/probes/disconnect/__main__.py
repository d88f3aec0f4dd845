"""Client disconnect → cancel, measured: how long from a streaming client closing its
connection to its job's terminal `cancelled` event, and how many tokens the job generated
past what the client had been sent when it left.

    .venv/bin/python -m bench.probes.disconnect               # 20 trials
    .venv/bin/python -m bench.probes.disconnect --trials 50

One API process and one worker on the tiny Qwen2 model. Each trial streams a long chat
completion, reads a few chunks, then closes the connection. A second reader follows the
same job on `GET /v1/jobs/{id}/events` from the start, and timestamps every event as it
arrives: the disconnect → cancel time is the arrival of the `cancelled` event minus the
moment of the close. Tokens past the disconnect are the job's final `completion_tokens`
minus the tokens the follower had seen at the close (an upper bound of the tokens generated
after it: some of those were already decoded and on their way). The decoding step is the
follower's token rate before the close.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.chaos.cluster import MODEL_NAME, ChaosCluster

SETTINGS = {"OMP_NUM_THREADS": "1"}
TOKENS = 2000
CHUNKS_BEFORE_CLOSE = 10
TRIAL_TIMEOUT_S = 60.0


@dataclass
class Follower:
    """Every event of one job with its arrival time, read over SSE."""

    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, http: httpx.AsyncClient, job_id: str) -> None:
        async with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    self.events.append((time.perf_counter(), event))
                    if event["type"] in ("done", "error"):
                        self.ended.set()
                        return

    def tokens_until(self, moment: float) -> int:
        return sum(e["tokens"] for at, e in self.events if e["type"] == "token" and at <= moment)

    def step_s(self, until: float) -> float:
        arrivals = [(at, e["tokens"]) for at, e in self.events if e["type"] == "token"]
        arrivals = [(at, n) for at, n in arrivals if at <= until]
        tokens = sum(n for _, n in arrivals[1:])
        return (arrivals[-1][0] - arrivals[0][0]) / max(1, tokens)


@dataclass(frozen=True)
class Trial:
    cancel_s: float
    tokens_after: int
    step_s: float


async def trial(http: httpx.AsyncClient) -> Trial:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "tell me everything"}],
        "max_tokens": TOKENS,
        "min_tokens": TOKENS,
        "stream": True,
    }
    follower = Follower()
    following: asyncio.Task[None] | None = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as stream:
        chunks = 0
        async for line in stream.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if following is None:
                job_id = chunk["id"].removeprefix("chatcmpl-")
                following = asyncio.create_task(follower.follow(http, job_id))
            chunks += 1
            if chunks > CHUNKS_BEFORE_CLOSE:
                break
        closed_at = time.perf_counter()
        tokens_sent = follower.tokens_until(closed_at)
    # leaving the `async with` above closed the connection
    assert following is not None
    await asyncio.wait_for(follower.ended.wait(), TRIAL_TIMEOUT_S)
    await following
    ended_at, last = follower.events[-1]
    assert last["type"] == "error" and last["error_type"] == "cancelled", last
    record = (await http.get(f"/v1/jobs/{job_id}")).json()
    assert record["status"] == "cancelled", record
    return Trial(
        cancel_s=ended_at - closed_at,
        tokens_after=record["usage"]["completion_tokens"] - tokens_sent,
        step_s=follower.step_s(closed_at),
    )


async def run(trials: int) -> None:
    with ChaosCluster(SETTINGS) as cluster:
        port = cluster.start_api()
        cluster.start_worker()
        results: list[Trial] = []
        limits = httpx.Limits(keepalive_expiry=1.0)  # below uvicorn's 5 s keep-alive
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
            await trial(http)  # warm-up: first-use costs in the worker and the API
            for _ in range(trials):
                results.append(await trial(http))
    cancel_ms = sorted(t.cancel_s * 1000 for t in results)
    after = sorted(t.tokens_after for t in results)
    step_ms = statistics.median(t.step_s * 1000 for t in results)
    print(f"{trials} trials: client disconnect -> terminal `cancelled` event")
    print(
        f"  time:   p50 {statistics.median(cancel_ms):.1f} ms, "
        f"max {cancel_ms[-1]:.1f} ms, min {cancel_ms[0]:.1f} ms"
    )
    print(
        f"  tokens past what the client had been sent: p50 {statistics.median(after):.0f}, "
        f"max {after[-1]}, min {after[0]}"
    )
    print(f"  decoding step (median token interval before the close): {step_ms:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.disconnect", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(run(args.trials))


if __name__ == "__main__":
    main()
