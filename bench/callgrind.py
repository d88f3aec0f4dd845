"""A `redis-server` under valgrind's callgrind, for instruction counts that do not move with
the machine's load: the same script, arguments and server give the same count (the kernel's
share of a request, its socket reads and writes, is not counted)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tokenrelay.cli.embedded_redis import EmbeddedRedis

_STARTUP_TIMEOUT_S = 60.0
_SUMMARY = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


class CallgrindRedis(EmbeddedRedis):
    """`with CallgrindRedis() as server:` a server on `server.port`; `zero()` resets its
    instruction count, `instructions()` reads the count since."""

    def __init__(self) -> None:
        if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
            raise FileNotFoundError("valgrind is not installed (apt-get install valgrind)")
        self._dumps = Path(tempfile.mkdtemp(prefix="tokenrelay-callgrind-"))
        launcher = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={self._dumps}/out")
        super().__init__(startup_timeout_s=_STARTUP_TIMEOUT_S, launcher=launcher)

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        shutil.rmtree(self._dumps, ignore_errors=True)

    def zero(self) -> None:
        self._control("-z")

    def instructions(self) -> int:
        """Instructions the server ran since `zero()` (callgrind dumps them to a file)."""
        before = set(self._dumps.glob("out*"))
        self._control("-d")
        dumps = set(self._dumps.glob("out*")) - before
        if len(dumps) != 1:
            raise RuntimeError(f"expected one new callgrind dump, found {len(dumps)}")
        found = _SUMMARY.search(dumps.pop().read_text())
        if found is None:
            raise RuntimeError("a callgrind dump without its summary line")
        return int(found[1])

    def _control(self, option: str) -> None:
        subprocess.run(
            ["callgrind_control", option, str(self.pid)],
            check=True,
            capture_output=True,
            timeout=60,
        )
