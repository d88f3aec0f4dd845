"""Where the worker's time goes: py-spy on the `tokenrelay worker` process during one run.

The worker's batcher thread runs every decoding step in turn, so its wall time (py-spy with
`--idle`: waiting counts too) is what bounds throughput. Each sample is charged to the
innermost frame that names a part of the step loop (`worker/batcher.py`,
`worker/engines/transformers_engine.py`, `worker/engines/sampling.py`).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_ATTACH_S = 1.0
_RATE_HZ = 50
_LINE = re.compile(r"^thread \((\d+)\): ([^;]*);(.*) (\d+)$")
_FRAME = re.compile(r"^(?P<function>.+?) \((?P<file>[^()]*?)(?::\d+)?\)$")

#: Innermost-first matching: (function, file suffix) → the step-loop part it stands for.
PARTS: tuple[tuple[str, str, str], ...] = (
    ("sample_token", "worker/engines/sampling.py", "sampling (per row)"),
    ("_keep_rows", "worker/engines/transformers_engine.py", "cache trim (finished rows)"),
    ("_merge", "worker/engines/transformers_engine.py", "cache merge (joiners)"),
    ("_sample", "worker/engines/transformers_engine.py", "sampling (per row)"),
    ("_prefill", "worker/engines/transformers_engine.py", "prefill forward"),
    ("_decode", "worker/engines/transformers_engine.py", "decode forward"),
    ("_send", "worker/batcher.py", "Redis emit (one call per step)"),
    ("_publish", "worker/batcher.py", "detokenize + stop strings"),
    ("_take_new", "worker/batcher.py", "waiting for jobs"),
    ("_drop_stopped", "worker/batcher.py", "admission + stop checks"),
    ("_admit_waiting", "worker/batcher.py", "admission + stop checks"),
)


def py_spy() -> str | None:
    found = Path(sys.executable).parent / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy")


def record_during(pid: int, out_file: Path, run: Callable[[], T]) -> T:
    """Run `run()` while py-spy samples every thread of process `pid` into `out_file`."""
    binary = py_spy()
    if binary is None:
        raise FileNotFoundError("py-spy is not installed (pip install py-spy)")
    command = [binary, "record", "-p", str(pid), "--idle", "--threads", "--nonblocking"]
    command += ["-r", str(_RATE_HZ), "-f", "raw", "-o", str(out_file)]
    with open(out_file.with_suffix(".log"), "wb") as log:
        spy = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(_ATTACH_S)
    try:
        return run()
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


@dataclass(frozen=True)
class StepProfile:
    """Shares of the batcher thread's wall time, by step-loop part and by innermost frame."""

    samples: int
    parts: list[tuple[str, float]]
    leaves: list[tuple[str, float]]


def summarize(raw_file: Path, thread_name: str = "batcher", top: int = 8) -> StepProfile:
    parts: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in raw_file.read_text().splitlines():
        match = _LINE.match(line)
        if match is None or match.group(2) != thread_name:
            continue
        frames = match.group(3).split(";")
        count = int(match.group(4))
        total += count
        part = _part(frames)
        parts[part] += count
        if part != "waiting for jobs":
            leaves[_short(frames[-1])] += count
    if total == 0:
        return StepProfile(0, [], [])
    return StepProfile(
        samples=total,
        parts=[(name, n / total) for name, n in parts.most_common()],
        leaves=[(name, n / total) for name, n in leaves.most_common(top)],
    )


def _part(frames: list[str]) -> str:
    for frame in reversed(frames):
        parsed = _FRAME.match(frame)
        if parsed is None:
            continue
        name = parsed["function"].rsplit(".", 1)[-1]  # py-spy qualifies methods: Class.name
        for function, file, part in PARTS:
            if name == function and parsed["file"].endswith(file):
                return part
    return "other (step loop)"


def _short(frame: str) -> str:
    parsed = _FRAME.match(frame)
    if parsed is None:
        return frame
    file = parsed["file"]
    for marker in ("site-packages/", "/work/main/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{parsed['function']} ({file})"
