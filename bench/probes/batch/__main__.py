"""The Batch API's costs, measured in one run: API RSS while a 100 MB file uploads, Redis
memory per stored line, and a batch's throughput against the same requests sent as plain
jobs at the same concurrency (the lines the batch may hold at once).

    .venv/bin/python -m bench.probes.batch                  # 10,000 lines, 100 MB upload
    .venv/bin/python -m bench.probes.batch --lines 2000 --upload-mb 20

One API process and one worker on the synthetic engine (no model compute: what is
measured is the gateway's batch machinery), an embedded Redis. The table goes to stdout
with the load average it ran under.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.chaos.cluster import MODEL_NAME, ChaosCluster
from bench.common import log

MAX_INFLIGHT = 16
SETTINGS = {
    "TOKENRELAY_ENGINE": "synthetic",
    "TOKENRELAY_ALLOW_SYNTHETIC_ENGINE": "1",
    "TOKENRELAY_SYNTHETIC_TOKENS_PER_S": "400",
    "TOKENRELAY_MAX_INFLIGHT": str(MAX_INFLIGHT),
    "TOKENRELAY_BATCH_MAX_INFLIGHT_SHARE": "0.5",
    "TOKENRELAY_WORKER_CONCURRENCY": "8",
    "OMP_NUM_THREADS": "1",
}
CONCURRENCY = MAX_INFLIGHT // 2
TOKENS = 16


def body(i: int) -> dict[str, object]:
    content = f"request {i}: summarize the gateway's batch path"
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": TOKENS,
        "min_tokens": TOKENS,
    }


def line(i: int) -> str:
    return json.dumps(
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body(i)}
    )


def rss_kib(pid: int, field: str) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith(field + ":"):
            return int(row.split()[1])
    raise RuntimeError(field)


def redis_used(http_redis: object) -> int:
    import redis

    assert isinstance(http_redis, redis.Redis)
    return int(http_redis.info("memory")["used_memory"])


def upload(http: httpx.Client, path: Path) -> dict[str, object]:
    with path.open("rb") as handle:
        answer = http.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": (path.name, handle)}, timeout=600
        )
    answer.raise_for_status()
    return answer.json()  # type: ignore[no-any-return]


async def plain_jobs(base_url: str, count: int) -> float:
    """Seconds to run `count` jobs, `CONCURRENCY` at a time, each waited for to its end."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            answer = await http.post("/v1/chat/completions", json=body(i))
            answer.raise_for_status()

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        await asyncio.gather(*(client(http) for _ in range(CONCURRENCY)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--upload-mb", type=int, default=100)
    args = parser.parse_args()
    import redis

    with ChaosCluster(SETTINGS) as cluster, tempfile.TemporaryDirectory() as tmp:
        port = cluster.start_api()
        cluster.start_worker()
        api_pid = cluster.apis[port].pid
        base_url = f"http://127.0.0.1:{port}"
        store = redis.Redis.from_url(cluster.redis_url)
        with httpx.Client(base_url=base_url, timeout=60) as http:
            big = Path(tmp) / "big.jsonl"
            # long lines (~4 KB), so 100 MB stays under the 50,000 requests of a file
            filler = line(0).replace("summarize", "summarize " + "x" * 4000).encode() + b"\n"
            with big.open("wb") as out:
                for _ in range(args.upload_mb * 1024 * 1024 // len(filler)):
                    out.write(filler)
            before_kib = rss_kib(api_pid, "VmRSS")
            memory_before = redis_used(store)
            log(f"uploading {big.stat().st_size / 1e6:.0f} MB")
            started = time.perf_counter()
            uploaded = upload(http, big)
            upload_s = time.perf_counter() - started
            peak_kib = rss_kib(api_pid, "VmHWM")
            stored_per_byte = (redis_used(store) - memory_before) / big.stat().st_size
            http.delete(f"/v1/files/{uploaded['id']}")

            small = Path(tmp) / "batch.jsonl"
            small.write_text("".join(line(i) + "\n" for i in range(args.lines)))
            file_id = upload(http, small)["id"]
            log(f"batch of {args.lines} lines")
            memory_before = redis_used(store)
            started = time.perf_counter()
            batch = http.post(
                "/v1/batches",
                json={
                    "input_file_id": file_id,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
            ).json()
            per_line = 0.0
            while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
                time.sleep(0.5)
                batch = http.get(f"/v1/batches/{batch['id']}").json()
                if batch["status"] == "in_progress" and not per_line:
                    per_line = (redis_used(store) - memory_before) / args.lines
            batch_s = time.perf_counter() - started
            assert batch["status"] == "completed", batch
            log(f"the same {args.lines} requests as plain requests, {CONCURRENCY} at a time")
            jobs_s = asyncio.run(plain_jobs(base_url, args.lines))
            batch_peak_kib = rss_kib(api_pid, "VmHWM")
        store.close()
    load = os.getloadavg()
    rows = [
        ("upload", f"{args.upload_mb} MB in {upload_s:.1f} s"),
        ("API RSS before upload", f"{before_kib / 1024:.0f} MiB"),
        ("API RSS peak during upload", f"{peak_kib / 1024:.0f} MiB"),
        ("Redis bytes per uploaded byte", f"{stored_per_byte:.2f}"),
        ("Redis bytes per validated line (requests hash)", f"{per_line:.0f}"),
        ("batch", f"{args.lines / batch_s:.1f} lines/s ({batch_s:.1f} s)"),
        ("plain jobs, same concurrency", f"{args.lines / jobs_s:.1f} req/s ({jobs_s:.1f} s)"),
        ("batch / plain", f"{jobs_s / batch_s:.2f}x"),
        ("API RSS peak after the batch", f"{batch_peak_kib / 1024:.0f} MiB"),
        ("load average (1, 5, 15 min)", " ".join(f"{x:.2f}" for x in load)),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name:<{width}} | {value} |")


if __name__ == "__main__":
    main()
