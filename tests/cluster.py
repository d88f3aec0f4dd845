"""Real tokenrelay processes for end-to-end tests: `tokenrelay api` and `tokenrelay worker`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from rq import Worker

from shared.embedded_redis import EmbeddedRedis, free_port

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
MODEL_NAME = "tiny"


def tokenrelay_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "shared.cli", *args]


@dataclass
class Cluster:
    """API processes and workers against one Redis; `stop()` ends them all."""

    redis_url: str
    model_dir: Path
    log_dir: Path
    settings: dict[str, str] = field(default_factory=dict)
    api_port: int = 0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            TOKENRELAY_REDIS_URL=self.redis_url,
            TOKENRELAY_MODEL=str(self.model_dir),
            TOKENRELAY_SERVED_MODEL_NAME=MODEL_NAME,
            HF_HUB_OFFLINE="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.settings)
        return env

    def _spawn(
        self, name: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}-{len(self.processes)}.log", "wb")  # noqa: SIM115
        env = self.env() | (extra_env or {})
        process = subprocess.Popen(
            tokenrelay_command(*args), env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.processes.append(process)
        return process

    def start_api(self, workers: int = 1) -> subprocess.Popen[bytes]:
        self.api_port = free_port()
        process = self._spawn("api", "api", "--port", str(self.api_port), "--workers", str(workers))
        _wait_until(lambda: self._ready(process), "API /readyz")
        return process

    def start_worker(self, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        connection = redis.Redis.from_url(self.redis_url)
        before = Worker.count(connection=connection)
        process = self._spawn("worker", "worker", extra_env=extra_env)
        _wait_until(
            lambda: _alive(process) and Worker.count(connection=connection) > before,
            "worker registration",
        )
        connection.close()
        return process

    def _ready(self, process: subprocess.Popen[bytes]) -> bool:
        if not _alive(process):
            raise RuntimeError(f"API exited with {process.returncode}; see {self.log_dir}")
        try:
            return httpx.get(f"{self.base_url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()


@contextmanager
def running_cluster(
    model_dir: Path, log_dir: Path, settings: dict[str, str], *, api_workers: int = 1
) -> Iterator[Cluster]:
    """A cluster on its own Redis: one worker, one API with `api_workers` processes."""
    with EmbeddedRedis() as server:
        cluster = Cluster(
            redis_url=server.url, model_dir=model_dir, log_dir=log_dir, settings=settings
        )
        try:
            cluster.start_worker()
            cluster.start_api(workers=api_workers)
            yield cluster
        finally:
            cluster.stop()


def _alive(process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"process {process.args} exited with {process.returncode}")
    return True


def _wait_until(condition: object, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")
