"""Job timeouts on the worker's one watchdog thread (`worker.job_timeouts`)."""

from __future__ import annotations

import threading
import time

import pytest
from rq.timeouts import JobTimeoutException

from tokenrelay.worker.job_timeouts import WatchdogDeathPenalty


def _wait_in_slices(seconds: float) -> None:
    """Block for `seconds` in short waits, as a job thread does, so an asynchronous
    exception can land between them."""
    idle = threading.Event()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        idle.wait(0.02)


def test_a_deadline_raises_in_its_thread_and_a_cancelled_one_never_does() -> None:
    started = time.monotonic()
    message = r"maximum timeout value \(2 seconds\)"
    with pytest.raises(JobTimeoutException, match=message), WatchdogDeathPenalty(2):
        with WatchdogDeathPenalty(1):
            pass
        _wait_in_slices(10)
    assert 1.9 <= time.monotonic() - started < 8


def test_deadlines_of_two_threads_each_raise_in_their_own() -> None:
    outcomes: dict[str, str] = {}

    def job(name: str, timeout: int, work_s: float) -> None:
        try:
            with WatchdogDeathPenalty(timeout, JobTimeoutException):
                _wait_in_slices(work_s)
            outcomes[name] = "done"
        except JobTimeoutException:
            outcomes[name] = "timed out"

    threads = [
        threading.Thread(target=job, args=("slow", 1, 10)),
        threading.Thread(target=job, args=("quick", 3, 1.5)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert outcomes == {"slow": "timed out", "quick": "done"}
