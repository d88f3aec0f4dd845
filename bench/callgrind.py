"""A `redis-server` under valgrind's callgrind, for instruction counts that do not move with
the machine's load: the same script, arguments and server give the same count (the kernel's
share of a request, its socket reads and writes, is not counted)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tokenrelay.cli.embedded_redis import find_redis_server, free_port

_STARTUP_TIMEOUT_S = 60.0
_SUMMARY = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


class CallgrindRedis:
    """`with CallgrindRedis() as server:` a server on `server.port`; `zero()` resets its
    instruction count, `instructions()` reads the count since."""

    def __init__(self) -> None:
        if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
            raise FileNotFoundError("valgrind is not installed (apt-get install valgrind)")
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="tokenrelay-callgrind-"))
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> CallgrindRedis:
        args = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={self._dir}/callgrind.out",
            find_redis_server(),
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(self._dir)),
        ]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1.0)
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    self.__exit__()
                    raise RuntimeError("redis-server under callgrind did not start") from None
                time.sleep(0.2)
        client.close()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=30)
            self._process = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def zero(self) -> None:
        self._control("-z")

    def instructions(self) -> int:
        """Instructions the server ran since `zero()` (callgrind dumps them to a file)."""
        before = set(self._dir.glob("callgrind.out*"))
        self._control("-d")
        dumps = set(self._dir.glob("callgrind.out*")) - before
        if len(dumps) != 1:
            raise RuntimeError(f"expected one new callgrind dump, found {len(dumps)}")
        found = _SUMMARY.search(dumps.pop().read_text())
        if found is None:
            raise RuntimeError("a callgrind dump without its summary line")
        return int(found[1])

    def _control(self, option: str) -> None:
        assert self._process is not None
        subprocess.run(
            ["callgrind_control", option, str(self._process.pid)],
            check=True,
            capture_output=True,
            timeout=60,
        )
