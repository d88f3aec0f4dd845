"""Waiting on a condition in tests and benchmarks, with a bound that names what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_INTERVAL_S = 0.05


def eventually(
    condition: Callable[[], object],
    timeout_s: float,
    what: str,
    interval_s: float = POLL_INTERVAL_S,
) -> None:
    """Poll `condition` until it is truthy; `TimeoutError` naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
