"""Real tokenrelay processes for end-to-end tests: `tokenrelay api` and `tokenrelay worker`,
on the shared process harness (`tokenrelay.cli.harness`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.cli.harness import Child, ProcessGroup, tokenrelay_env

MODEL_NAME = "tiny"


def synthetic_engine(tokens_per_s: float = 20) -> dict[str, str]:
    """Settings of workers on the model-free engine, at `tokens_per_s` per job."""
    return {
        "TOKENRELAY_ENGINE": "synthetic",
        "TOKENRELAY_ALLOW_SYNTHETIC_ENGINE": "1",
        "TOKENRELAY_SYNTHETIC_TOKENS_PER_S": str(tokens_per_s),
    }


def stream_chat(base_url: str, max_tokens: int, messages: list[dict[str, str]]) -> tuple[str, str]:
    """One streamed chat completion: its job id and the text its chunks carried."""
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens, "stream": True}
    parts, job_id = [], ""
    with (
        httpx.Client(base_url=base_url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line.removeprefix("data: "))
            job_id = data["id"].removeprefix("chatcmpl-")
            parts += [c["delta"].get("content") or "" for c in data["choices"]]
    return job_id, "".join(parts)


@dataclass
class Cluster:
    """API processes and workers against one Redis; `stop()` ends them all.

    `settings` are environment variables every process started afterwards gets.
    """

    redis_url: str
    model_dir: Path
    log_dir: Path
    settings: dict[str, str] = field(default_factory=dict)
    api_port: int = 0
    group: ProcessGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = ProcessGroup(env=dict(os.environ), log_dir=self.log_dir)

    @property
    def base_url(self) -> str:
        """The API started last."""
        return f"http://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str]:
        return tokenrelay_env(self.redis_url, str(self.model_dir), MODEL_NAME) | self.settings

    def start_api(self, workers: int = 1) -> Child:
        self.api_port = free_port()
        return self.group.start_api(self.api_port, workers=workers, env=self.env())

    def start_worker(self, extra_env: dict[str, str] | None = None, **options: Any) -> Child:
        """A worker with `extra_env` on top of `env()`; `options` go to `start_worker`."""
        env = self.env() | (extra_env or {})
        return self.group.start_worker(self.redis_url, env=env, **options)

    def stop(self) -> None:
        self.group.stop()


ClusterFactory = Callable[..., Cluster]
"""The `make_cluster` fixtures: `make(settings, **running_cluster options) -> Cluster`."""


@contextmanager
def running_cluster(
    model_dir: Path,
    log_dir: Path,
    settings: dict[str, str] | None = None,
    *,
    api_workers: int = 1,
    workers: int = 1,
    redis_url: str | None = None,
) -> Iterator[Cluster]:
    """A cluster on its own Redis (or `redis_url`): `workers` workers (0: none yet), then one
    API with `api_workers` processes (none when `api_workers` is 0)."""
    with _redis(redis_url) as url:
        cluster = Cluster(redis_url=url, model_dir=model_dir, log_dir=log_dir)
        cluster.settings.update(settings or {})
        try:
            for _ in range(workers):
                cluster.start_worker()
            if api_workers:
                cluster.start_api(workers=api_workers)
            yield cluster
        finally:
            cluster.stop()


@contextmanager
def _redis(redis_url: str | None) -> Iterator[str]:
    if redis_url is not None:
        yield redis_url
        return
    with EmbeddedRedis() as server:
        yield server.url
