"""Trying a Redis call again after an error, with bounded exponential backoff, until a
deadline: how a worker rides out a Redis restart or a Sentinel failover without ending
jobs that are still healthy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from redis.exceptions import RedisError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Backoff:
    """Bounded exponential backoff between tries after Redis errors."""

    def __init__(self, first_s: float = 0.05, max_s: float = 1.0) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._delay_s = 0.0
        self._next_try = float("-inf")

    def ready(self) -> bool:
        return time.monotonic() >= self._next_try

    def wait_s(self) -> float:
        """Seconds until the next try is due (0 when it is)."""
        return max(0.0, self._next_try - time.monotonic())

    def failed(self) -> None:
        self._delay_s = min(self._max_s, max(self._first_s, self._delay_s * 2))
        self._next_try = time.monotonic() + self._delay_s

    def succeeded(self) -> None:
        self._delay_s = 0.0
        self._next_try = float("-inf")

    def sleep(self) -> None:
        """Count a failure and wait until the next try is due."""
        self.failed()
        time.sleep(self.wait_s())


def retry_until(
    call: Callable[[], T],
    *,
    give_up_at: float,
    what: str,
    errors: tuple[type[Exception], ...] = (RedisError,),
) -> T:
    """`call()`'s result, calling again after each of `errors` (logged as a warning naming
    `what`) until `time.monotonic()` passes `give_up_at`; then the last error is raised."""
    backoff = Backoff()
    while True:
        try:
            return call()
        except errors as exc:
            if time.monotonic() >= give_up_at:
                raise
            log.warning("%s failed, will retry: %s", what, exc)
            backoff.sleep()
