"""The processes one row of `bench.prefix` measures: a real Redis, one `tokenrelay api` and N
`tokenrelay worker` processes on the benchmark checkpoint, on the shared process harness.

`Variant` says what a row runs: the engine, how many workers, and whether the transformers
engine's prefix cache (`TOKENRELAY_PREFIX_CACHE_BYTES`) and placement by prefix
(`TOKENRELAY_PREFIX_PLACEMENT`) are on. Every worker computes on one thread: transformers
workers get `OMP_NUM_THREADS=1`, vLLM workers bind their OpenMP threads to one core each
(`VLLM_CPU_OMP_THREADS_BIND`), so N workers on N cores do not fight over threads.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
from rq import Worker

from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.cli.harness import Child, ProcessGroup, tokenrelay_command, tokenrelay_env

SERVED_MODEL_NAME = "bench"
WORKER_READY_TIMEOUT_S = 600.0
API_READY_TIMEOUT_S = 120.0
#: vLLM's context window here: above the longest conversation, and its start-up warm-up
#: runs one step of it on one thread, so no longer than needed.
VLLM_MAX_MODEL_LEN = 2048
#: GiB of KV cache per vLLM worker (a 1,300-token prompt of the 0.5B shape is ~16 MB).
VLLM_KV_CACHE_GIB = 1


@dataclass(frozen=True)
class Variant:
    engine: str  # "transformers" or "vllm"
    workers: int
    cache: bool  # transformers only: vLLM's prefix caching is always on in its engine
    placement: bool

    @property
    def label(self) -> str:
        cache = "on" if self.cache else "off"
        placement = "on" if self.placement else "off"
        return f"{self.engine} x{self.workers}, cache {cache}, placement {placement}"


@dataclass(frozen=True)
class Launch:
    """What every cluster of the run shares: the checkpoint, its dtype, the interpreters."""

    model_dir: Path
    dtype: str
    vllm_python: str
    log_dir: Path


class PrefixCluster:
    """`with PrefixCluster(variant, launch) as cluster:` runs Redis, the API and the workers."""

    def __init__(self, variant: Variant, launch: Launch) -> None:
        self.variant = variant
        self._launch = launch
        self._redis = EmbeddedRedis()
        self._group: ProcessGroup | None = None
        self.base_url = ""
        #: The RQ names of the workers, in the order they were started.
        self.worker_names: list[str] = []

    def __enter__(self) -> PrefixCluster:
        self._redis.start()
        env = {
            **os.environ,
            **tokenrelay_env(self._redis.url, str(self._launch.model_dir), SERVED_MODEL_NAME),
            "TOKENRELAY_DEVICE": "cpu",
            "TOKENRELAY_DTYPE": self._launch.dtype,
            "TOKENRELAY_MAX_INFLIGHT": "1000",
            "TOKENRELAY_PREFIX_CACHE_BYTES": str(1 << 30 if self.variant.cache else 0),
            "TOKENRELAY_PREFIX_PLACEMENT": "on" if self.variant.placement else "off",
            "OMP_NUM_THREADS": "1",
        }
        self._group = ProcessGroup(env=env, log_dir=self._launch.log_dir)
        try:
            self._start_workers()
            port = free_port()
            self._group.start_api(port, ready_timeout_s=API_READY_TIMEOUT_S)
            self.base_url = f"http://127.0.0.1:{port}"
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start_workers(self) -> None:
        """Spawn every worker at once (a vLLM worker takes tens of seconds to start), then
        wait until all have registered with RQ."""
        assert self._group is not None
        vllm = self.variant.engine == "vllm"
        python = self._launch.vllm_python if vllm else sys.executable
        cores = os.cpu_count() or 1
        children: list[Child] = []
        for index in range(self.variant.workers):
            env = _vllm_env(index % cores) if vllm else {}
            command = tokenrelay_command("worker", python=python)
            children.append(self._group.spawn("worker", command, env))
        pids = {child.pid for child in children}
        deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
        with redis.Redis.from_url(self._redis.url) as connection:
            while True:
                for child in children:
                    child.check_running()
                names = {w.pid: w.name for w in Worker.all(connection=connection)}
                if pids <= names.keys():
                    self.worker_names = [names[child.pid] for child in children]
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(pids - names.keys())} workers did not register")
                time.sleep(0.5)

    def workers_of(self, job_id: str, client: httpx.Client) -> list[str]:
        """The workers that ran a job, from its record (`GET /v1/jobs/{id}`)."""
        reply = client.get(f"{self.base_url}/v1/jobs/{job_id}")
        workers = reply.raise_for_status().json().get("workers") or []
        return [str(worker) for worker in workers]

    def stop(self) -> None:
        if self._group is not None:
            self._group.stop()
            self._group = None
        self._redis.stop()


def _vllm_env(core: int) -> dict[str, str]:
    return {
        "TOKENRELAY_ENGINE": "vllm",
        "TOKENRELAY_VLLM_CPU_MAX_MODEL_LEN": str(VLLM_MAX_MODEL_LEN),
        "VLLM_CPU_KVCACHE_SPACE": str(VLLM_KV_CACHE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
