"""The two HTTP servers the benchmark drives, as child processes on free local ports.

(c) `transformers serve --continuous-batching` on the model directory, with explicit
`--cb-*` cache flags. (d) tokenrelay end to end: an embedded Redis, one `tokenrelay api`
and one `tokenrelay worker`, so a request goes HTTP → admission → RQ → worker → SSE. Both
run on the shared process harness (`tokenrelay.cli.harness`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from bench.worker_throughput.stats import child_pids
from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.cli.harness import Child, ProcessGroup
from tokenrelay.testing.polling import eventually

STARTUP_TIMEOUT_S = 600.0
SERVED_MODEL_NAME = "bench"
#: The context window of both vLLM modes, as tokenrelay's vLLM engine caps it on CPU
#: (TOKENRELAY_VLLM_CPU_MAX_MODEL_LEN's default): vLLM's warm-up runs one step of it.
VLLM_CPU_MAX_MODEL_LEN = 4096
#: vLLM on this CPU: a KV cache (GiB) and both cores for its compute threads.
VLLM_CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "4",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}


class StreamingServer(Protocol):
    """An OpenAI-compatible server: where to POST chat completions and what to send."""

    @property
    def chat_url(self) -> str: ...

    def request_body(self, chat: list[dict], new_tokens: int) -> dict: ...

    def pids(self) -> dict[str, int]:
        """Process role → pid, for CPU accounting and profiling."""
        ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class CbFlags:
    """`transformers serve --cb-*` settings: KV pages of `block_size` tokens, `num_blocks` of
    them, and at most `max_batch_tokens` tokens per forward pass."""

    block_size: int
    num_blocks: int
    max_batch_tokens: int

    def args(self) -> list[str]:
        return [
            "--cb-block-size",
            str(self.block_size),
            "--cb-num-blocks",
            str(self.num_blocks),
            "--cb-max-batch-tokens",
            str(self.max_batch_tokens),
        ]


def exact_length_body(chat: list[dict], new_tokens: int) -> dict:
    """A streamed chat completion of exactly `new_tokens` tokens (`min_tokens`, which both
    tokenrelay and vLLM take), with usage."""
    return {
        "model": SERVED_MODEL_NAME,
        "messages": chat,
        "max_tokens": new_tokens,
        "min_tokens": new_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _child_with_argument(argument: str) -> int | None:
    """The pid of a child of this process whose command line has `argument`."""
    for pid in child_pids().get(os.getpid(), []):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                arguments = cmdline.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argument in arguments:
            return pid
    return None


def _wait_until_responds(child: Child, url: str) -> None:
    """Wait (up to `STARTUP_TIMEOUT_S`) for `url` to answer 200 while `child` runs."""

    def responds() -> bool:
        child.check_running()
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    eventually(responds, STARTUP_TIMEOUT_S, f"{url} to answer 200", interval_s=0.5)


class TransformersServe:
    """(c): `transformers serve MODEL_DIR --continuous-batching` with explicit cache flags.

    EOS is ignored by sending a `generation_config` whose `eos_token_id` is -1 (no token),
    with the model's own sampling defaults; continuous batching takes its shared sampling
    settings from the first request, which is the same for every request here.
    """

    def __init__(
        self, model_dir: Path, dtype: str, cb: CbFlags, sampling: dict, log_dir: Path
    ) -> None:
        self._model = str(model_dir)
        self._sampling = sampling
        port = free_port()
        self._url = f"http://127.0.0.1:{port}"
        command = [
            str(Path(sys.executable).parent / "transformers"),
            "serve",
            self._model,
            "--continuous-batching",
            *cb.args(),
            "--device",
            "cpu",
            "--dtype",
            dtype,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        self._group = ProcessGroup(log_dir=log_dir)
        self._process = self._group.spawn("transformers-serve", command, {"HF_HUB_OFFLINE": "1"})
        try:
            _wait_until_responds(self._process, f"{self._url}/health")
        except BaseException:
            self.stop()
            raise

    @property
    def chat_url(self) -> str:
        return f"{self._url}/v1/chat/completions"

    def request_body(self, chat: list[dict], new_tokens: int) -> dict:
        generation = {**self._sampling, "max_new_tokens": new_tokens, "eos_token_id": -1}
        return {
            "model": self._model,
            "messages": chat,
            "max_tokens": new_tokens,
            "stream": True,
            "generation_config": json.dumps(generation),
        }

    def pids(self) -> dict[str, int]:
        return {"transformers serve": self._process.pid}

    def stop(self) -> None:
        self._group.stop()


class TokenrelayStack:
    """(d): embedded Redis + `tokenrelay api` + one `tokenrelay worker`."""

    def __init__(
        self,
        model_dir: Path,
        dtype: str,
        concurrency: int,
        log_dir: Path,
        vllm_python: str | None = None,
        device: str = "cpu",
    ) -> None:
        """With `vllm_python` (the vLLM environment's interpreter), the worker runs the vLLM
        engine (`TOKENRELAY_ENGINE=vllm`) in that environment: mode (e)."""
        self.max_inflight = max(1000, 4 * concurrency)
        self._redis = EmbeddedRedis()
        self._redis.start()
        port = free_port()
        self._url = f"http://127.0.0.1:{port}"
        env = {
            "TOKENRELAY_REDIS_URL": self._redis.url,
            "TOKENRELAY_MODEL": str(model_dir),
            "TOKENRELAY_SERVED_MODEL_NAME": SERVED_MODEL_NAME,
            "TOKENRELAY_WORKER_CONCURRENCY": str(concurrency),
            "TOKENRELAY_MAX_INFLIGHT": str(self.max_inflight),
            "TOKENRELAY_DEVICE": device,
            "TOKENRELAY_DTYPE": dtype,
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        worker_env = {"TOKENRELAY_ENGINE": "vllm", **VLLM_CPU_ENV} if vllm_python else {}
        self._group = ProcessGroup(env={**os.environ, **env}, log_dir=log_dir)
        try:
            self._api = self._group.start_api(port, ready_timeout_s=STARTUP_TIMEOUT_S)
            self._worker = self._group.start_worker(
                self._redis.url,
                env=worker_env,
                ready_timeout_s=STARTUP_TIMEOUT_S,
                python=vllm_python or sys.executable,
            )
        except BaseException:
            self.stop()
            raise

    @property
    def chat_url(self) -> str:
        return f"{self._url}/v1/chat/completions"

    def request_body(self, chat: list[dict], new_tokens: int) -> dict:
        return exact_length_body(chat, new_tokens)

    def job_times(self, request_id: str) -> tuple[float, float | None]:
        """`created_at` (admitted) and `started_at` (a worker took it) of the job behind a
        chat completion id (`chatcmpl-<job id>`), as Unix times."""
        job_id = request_id.removeprefix("chatcmpl-")
        record = httpx.get(f"{self._url}/v1/jobs/{job_id}", timeout=10).raise_for_status().json()
        return float(record["created_at"]), record.get("started_at")

    def pids(self) -> dict[str, int]:
        pids = {"tokenrelay api": self._api.pid, "tokenrelay worker": self._worker.pid}
        redis_pid = _child_with_argument(f"{self._redis.port}")
        if redis_pid is not None:
            pids["redis-server"] = redis_pid
        return pids

    def stop(self) -> None:
        self._group.stop()
        self._redis.stop()


class VllmServe:
    """(f): vLLM's own OpenAI server (`vllm.entrypoints.openai.api_server`, from the vLLM
    environment) on the model directory, sampling as tokenrelay does: the model's
    `generation_config.json` temperature, top-p and top-k, sent with each request, and no
    repetition penalty (neither tokenrelay engine applies one); EOS held back with
    `min_tokens` as for (d) and (e)."""

    def __init__(
        self,
        vllm_python: str,
        model_dir: Path,
        dtype: str,
        concurrency: int,
        sampling: dict,
        log_dir: Path,
    ) -> None:
        self._sampling = sampling
        port = free_port()
        self._url = f"http://127.0.0.1:{port}"
        command = [
            vllm_python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            SERVED_MODEL_NAME,
            "--dtype",
            dtype,
            "--max-num-seqs",
            str(concurrency),
            "--generation-config",
            "vllm",
            "--max-model-len",
            str(VLLM_CPU_MAX_MODEL_LEN),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        self._group = ProcessGroup(log_dir=log_dir)
        self._process = self._group.spawn("vllm-serve", command, VLLM_CPU_ENV)
        try:
            _wait_until_responds(self._process, f"{self._url}/health")
        except BaseException:
            self.stop()
            raise

    @property
    def chat_url(self) -> str:
        return f"{self._url}/v1/chat/completions"

    def request_body(self, chat: list[dict], new_tokens: int) -> dict:
        return {**exact_length_body(chat, new_tokens), **self._sampling}

    def pids(self) -> dict[str, int]:
        return {"vllm serve": self._process.pid}

    def stop(self) -> None:
        self._group.stop()
