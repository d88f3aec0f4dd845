"""Real processes for `bench.chaos` and `bench.probes.disconnect`, each killable on its own.

`ChaosCluster` runs an embedded Redis (`stop()` / `start()` keep its port; a restarted Redis
is empty unless it was made `persistent`) or a Sentinel group (`EmbeddedSentinel`),
`tokenrelay api` processes (one uvicorn process each, on a port that a restart reuses) and
`tokenrelay worker` processes on the tiny Qwen2 checkpoint, all on the shared process harness
(`tokenrelay.cli.harness`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.cli.harness import Child, ProcessGroup, tokenrelay_env

MODEL_NAME = "tiny"


class RedisService(Protocol):
    """What the cluster runs its processes against: an `EmbeddedRedis` or an
    `EmbeddedSentinel` (whose `url` names the first primary; the sentinels are settings)."""

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def __exit__(self, *exc_info: object) -> None: ...


def build_model(directory: Path) -> Path:
    from tokenrelay.worker.devmodels.tiny import build_tiny_model

    return build_tiny_model(directory)


@dataclass
class ChaosCluster:
    """`with ChaosCluster(settings) as cluster:`; everything it started stops on exit."""

    settings: dict[str, str]
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tokenrelay-")))
    redis_server: RedisService = field(default_factory=EmbeddedRedis)
    apis: dict[int, Child] = field(default_factory=dict)
    workers: list[Child] = field(default_factory=list)
    group: ProcessGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = ProcessGroup(log_dir=self.work_dir)

    def __enter__(self) -> ChaosCluster:
        self.model_dir = build_model(self.work_dir / "model")
        self.redis_server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.group.stop()
        self.redis_server.__exit__()

    @property
    def redis_url(self) -> str:
        return self.redis_server.url

    def env(self) -> dict[str, str]:
        """What every started process gets on top of this process's environment."""
        return tokenrelay_env(self.redis_url, str(self.model_dir), MODEL_NAME) | self.settings

    def start_api(self, port: int | None = None) -> int:
        """Start one API process (on `port` again after a kill); returns its port."""
        port = port or free_port()
        self.apis[port] = self.group.start_api(port, env=self.env())
        return port

    def kill_api(self, port: int) -> None:
        self._kill(self.apis.pop(port))

    def start_worker(self) -> Child:
        worker = self.group.start_worker(self.redis_url, env=self.env())
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: Child) -> None:
        self.workers.remove(worker)
        self._kill(worker)

    def _kill(self, child: Child) -> None:
        child.kill()
        self.group.remove(child)
