"""What one benchmark run measured, and the medians over repeats that the table prints."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestTiming:
    """One request: when it was due (seconds from the run's start), when its first token
    (or first non-empty text, for streaming modes) arrived, and when it ended."""

    due_s: float
    first_token_s: float
    end_s: float
    tokens: int
    request_id: str = ""

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.due_s


@dataclass(frozen=True)
class RunResult:
    """One run of N requests; `wall_s` spans the first request's due time to the last end."""

    timings: tuple[RequestTiming, ...]
    wall_s: float
    foreign_cpu: float
    started_at: float = 0.0  # `time.time()` at the run's start, to line up with server clocks

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.timings)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def ttft(self, q: float) -> float:
        return percentile([t.ttft_s for t in self.timings], q)


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-quantile (0..1) with linear interpolation between ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class CellSummary:
    """Medians over the repeats of one (shape, mode, concurrency) cell."""

    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    runs: int
    foreign_cpu: float
    uneven: bool

    @classmethod
    def of(cls, runs: Sequence[RunResult], expected_tokens: int) -> CellSummary:
        return cls(
            tokens_per_s=statistics.median(r.tokens_per_s for r in runs),
            ttft_p50_s=statistics.median(r.ttft(0.5) for r in runs),
            ttft_p99_s=statistics.median(r.ttft(0.99) for r in runs),
            runs=len(runs),
            foreign_cpu=statistics.median(r.foreign_cpu for r in runs),
            uneven=any(t.tokens != expected_tokens for r in runs for t in r.timings),
        )


class CpuMeter:
    """Share of the machine's CPU that processes outside this benchmark's process tree used
    between `start()` and `foreign_share()`: other engineers' jobs share these cores."""

    def __init__(self) -> None:
        self._busy = 0
        self._ours = 0
        self._at = 0.0

    def start(self) -> None:
        self._busy, self._ours, self._at = _busy_ticks(), _tree_ticks(os.getpid()), time.monotonic()

    def foreign_share(self) -> float:
        busy = _busy_ticks() - self._busy
        ours = _tree_ticks(os.getpid()) - self._ours
        capacity = (time.monotonic() - self._at) * _TICKS_PER_S * (os.cpu_count() or 1)
        return max(0.0, busy - ours) / capacity if capacity > 0 else math.nan


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def wait_for_quiet(max_share: float, timeout_s: float, window_s: float = 2.0) -> float:
    """Wait (up to `timeout_s`) for a `window_s` in which processes outside this benchmark use
    less than `max_share` of the machine's CPU; returns the seconds waited."""
    started = time.monotonic()
    meter = CpuMeter()
    while True:
        meter.start()
        time.sleep(window_s)
        waited = time.monotonic() - started
        if meter.foreign_share() < max_share or waited >= timeout_s:
            return waited


def _busy_ticks() -> int:
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    return sum(fields[:8]) - idle - iowait


def process_ticks(pid: int) -> int:
    """User + system CPU ticks of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def child_pids() -> dict[int, list[int]]:
    """Every live process's children, by parent pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def _tree_ticks(root: int) -> int:
    children = child_pids()
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += process_ticks(pid)
        todo.extend(children.get(pid, []))
    return total
