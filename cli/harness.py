"""One process harness for `tokenrelay serve`, the tests and the benchmarks.

A `ProcessGroup` starts child processes (`tokenrelay api`, `tokenrelay worker`, or any
command), waits until each is ready, and stops them all together: SIGTERM, a shared
deadline, then SIGKILL. Children are started by the installed package's module path with
`python -P`, so a current directory holding its own `api/` or `shared/` is never imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
from rq import Worker

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05
_LOG_TAIL_BYTES = 4000


def tokenrelay_command(*args: str, python: str = sys.executable) -> list[str]:
    """The command line of a `tokenrelay` subcommand in a child process (run by `python`:
    ours, or another environment's, such as the vLLM engine's)."""
    return [python, "-P", "-m", "tokenrelay.cli", *args]


def tokenrelay_env(redis_url: str, model: str, served_model_name: str) -> dict[str, str]:
    """The settings every process of one tokenrelay cluster shares, offline."""
    return {
        "TOKENRELAY_REDIS_URL": redis_url,
        "TOKENRELAY_MODEL": model,
        "TOKENRELAY_SERVED_MODEL_NAME": served_model_name,
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


class ChildExited(RuntimeError):
    """A child process ended while it was expected to run."""


@dataclass
class Child:
    """One started process, its log file (None: it writes to ours) and its name."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def check_running(self) -> None:
        """Raise `ChildExited` with the tail of the child's log if it has ended."""
        if self.running():
            return
        tail = ""
        if self.log_path is not None and self.log_path.exists():
            tail = self.log_path.read_bytes()[-_LOG_TAIL_BYTES:].decode(errors="replace")
        raise ChildExited(f"{self.name} exited with {self.process.returncode}\n{tail}")

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll `ready` until true; `ChildExited` if this child ends first, `TimeoutError`
        naming `what` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_running()
            if ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(POLL_INTERVAL_S)

    def signal(self, signum: int) -> None:
        if self.running():
            self.process.send_signal(signum)

    def kill(self) -> int:
        """SIGKILL and reap; returns the exit status."""
        self.signal(signal.SIGKILL)
        return self.process.wait(timeout=STOP_TIMEOUT_S)

    def wait(self, timeout_s: float) -> int | None:
        """The exit status, or None if the child still runs after `timeout_s`."""
        try:
            return self.process.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return None


@dataclass
class ProcessGroup:
    """Children started together, stopped together: `with ProcessGroup(env, log_dir) as g:`.

    `env` is the environment every child gets (default: ours); `log_dir`, where each child's
    output goes as `<name>-<n>.log` (default: our stdout and stderr). With
    `own_process_groups`, each child leads a process group of its own, so a signal to ours
    (a terminal's Ctrl-C: SIGINT to its foreground group) does not reach it: we stop it.
    """

    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    log_dir: Path | None = None
    own_process_groups: bool = False
    children: list[Child] = field(default_factory=list)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def spawn(
        self,
        name: str,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Child:
        """Start `command` (in `cwd`) with the group's environment updated by `env`."""
        child_env = {**self.env, **(env or {})}
        group = 0 if self.own_process_groups else None
        if self.log_dir is None:
            process = subprocess.Popen(list(command), env=child_env, cwd=cwd, process_group=group)
            child = Child(name, process, None)
        else:
            log_path = _free_log_path(self.log_dir, name)
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    list(command),
                    env=child_env,
                    cwd=cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    process_group=group,
                )
            child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def start_api(
        self,
        port: int,
        *,
        host: str = "127.0.0.1",
        workers: int = 1,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> Child:
        """`tokenrelay api` on `port`; returns once its `/readyz` answers 200."""
        args = ["api", "--host", host, "--port", str(port), "--workers", str(workers)]
        child = self.spawn("api", tokenrelay_command(*args), env)
        url = f"http://{host}:{port}/readyz"
        child.wait_ready(lambda: answers(url), ready_timeout_s, f"{url} to answer 200")
        return child

    def start_worker(
        self,
        redis_url: str,
        *,
        demo: bool = False,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        python: str = sys.executable,
    ) -> Child:
        """`tokenrelay worker` (run by `python`); returns once it has registered with RQ in
        `redis_url`."""
        command = tokenrelay_command("worker", *(["--demo"] * demo), python=python)
        child = self.spawn("worker", command, env)
        with redis.Redis.from_url(redis_url) as connection:
            child.wait_ready(
                lambda: _registered(child, connection),
                ready_timeout_s,
                f"worker {child.pid} to register",
            )
        return child

    def remove(self, child: Child) -> None:
        """Forget a child that the caller has ended itself (killed, say)."""
        self.children.remove(child)

    def wait_first_exit(self, should_stop: Callable[[], bool]) -> Child | None:
        """Block until a child ends (returned) or `should_stop()` (None is returned)."""
        while not should_stop():
            for child in self.children:
                if not child.running():
                    return child
            time.sleep(POLL_INTERVAL_S)
        return None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every child, wait for all under one deadline, SIGKILL the rest."""
        for child in self.children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            if child.wait(deadline - time.monotonic()) is None:
                child.kill()
        self.children.clear()


def _free_log_path(log_dir: Path, name: str) -> Path:
    """`<name>-<n>.log` for the first `n` not taken, so groups can share a folder."""
    n = 1
    while (log_dir / f"{name}-{n}.log").exists():
        n += 1
    return log_dir / f"{name}-{n}.log"


def answers(url: str) -> bool:
    """`url` answers 200 (within a second)."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _registered(child: Child, connection: redis.Redis) -> bool:
    return any(worker.pid == child.pid for worker in Worker.all(connection=connection))
