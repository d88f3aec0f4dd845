"""Real processes for `bench/chaos.py` and `bench/disconnect.py`, each killable on its own.

`ChaosCluster` runs an embedded Redis (`stop()` / `start()` keep its port; a restarted Redis
is empty: no persistence), `tokenrelay api` processes (one uvicorn process each, on a port
that a restart reuses) and `tokenrelay worker` processes on the tiny Qwen2 checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx
import redis
from rq import Worker

from shared.embedded_redis import EmbeddedRedis, free_port

MODEL_NAME = "tiny"
_STARTUP_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 20.0


def build_model(directory: Path) -> Path:
    from worker.tiny_model import build_tiny_model

    return build_tiny_model(directory)


@dataclass
class ChaosCluster:
    """`with ChaosCluster(settings) as cluster:`; everything it started stops on exit."""

    settings: dict[str, str]
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tokenrelay-")))
    redis_server: EmbeddedRedis = field(default_factory=EmbeddedRedis)
    apis: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _spawned: int = 0

    def __enter__(self) -> ChaosCluster:
        self.model_dir = build_model(self.work_dir / "model")
        self.redis_server.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for process in [*self.apis.values(), *self.workers]:
            _stop(process)
        self.redis_server.__exit__(exc_type, exc, tb)

    @property
    def redis_url(self) -> str:
        return self.redis_server.url

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

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        self._spawned += 1
        with open(self.work_dir / f"{name}-{self._spawned}.log", "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "shared.cli", *args],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def start_api(self, port: int | None = None) -> int:
        """Start one API process (on `port` again after a kill); returns its port."""
        port = port or free_port()
        process = self._spawn("api", "api", "--port", str(port))
        self.apis[port] = process
        _wait_until(lambda: _ready(process, port), f"API on port {port}")
        return port

    def kill_api(self, port: int) -> None:
        _kill(self.apis.pop(port))

    def start_worker(self) -> subprocess.Popen[bytes]:
        with redis.Redis.from_url(self.redis_url) as connection:
            before = Worker.count(connection=connection)
            process = self._spawn("worker", "worker")
            self.workers.append(process)
            _wait_until(
                lambda: _alive(process) and Worker.count(connection=connection) > before,
                "worker registration",
            )
        return process

    def kill_worker(self, process: subprocess.Popen[bytes]) -> None:
        self.workers.remove(process)
        _kill(process)


def _ready(process: subprocess.Popen[bytes], port: int) -> bool:
    _alive(process)
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _alive(process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
    return True


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=_STOP_TIMEOUT_S)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill(process)


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)
