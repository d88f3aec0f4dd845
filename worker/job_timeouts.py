"""RQ's job timeouts on one watchdog thread for the whole worker.

RQ's `TimerDeathPenalty` starts a `threading.Timer`, a thread, for every job: on a loaded 2-core box
that start is a measurable share of each job's way to its first token (docs/benchmarks/gateway.md).
Here every running job's deadline waits on one daemon thread, which raises the job's timeout
exception in the job's thread when it passes, as RQ's timer does (`PyThreadState_SetAsyncExc`: the
exception is raised at the thread's next bytecode)."""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
import time
from typing import Any

from rq.timeouts import BaseDeathPenalty, JobTimeoutException


class _Watchdog:
    """The deadlines of the running jobs, and the thread that enforces them."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._deadlines: dict[int, tuple[float, int, type[BaseException]]] = {}
        self._tokens = itertools.count()
        self._wakes_at = float("inf")
        self._thread: threading.Thread | None = None

    def arm(self, timeout_s: float, thread_id: int, exception: type[BaseException]) -> int:
        """Raise `exception` in thread `thread_id` in `timeout_s`, unless disarmed first;
        returns the token that disarms it."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            token = next(self._tokens)
            self._deadlines[token] = (deadline, thread_id, exception)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="job-timeouts")
                self._thread.daemon = True
                self._thread.start()
            elif deadline < self._wakes_at:  # jobs share one timeout: rarely
                self._changed.notify()
        return token

    def disarm(self, token: int) -> None:
        """After this returns, the deadline of `token` never fires."""
        with self._changed:
            self._deadlines.pop(token, None)

    def _watch(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for token, (deadline, thread_id, exception) in list(self._deadlines.items()):
                    if deadline <= now:
                        del self._deadlines[token]
                        _raise_in(thread_id, exception)
                self._wakes_at = min((d for d, _, _ in self._deadlines.values()), default=now + 60)
                self._changed.wait(self._wakes_at - now)


_WATCHDOG = _Watchdog()


def _raise_in(thread_id: int, exception: type[BaseException]) -> None:
    changed = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception)
    )
    if changed > 1:  # never expected: undo, as the C API asks
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)


@functools.cache
def _with_message(exception: type[BaseException], timeout: float) -> type[BaseException]:
    """`exception` whose instances say the timeout (an asynchronous exception is raised
    from its class, without arguments)."""

    def init(self: BaseException, *args: Any) -> None:
        exception.__init__(self, f"Task exceeded maximum timeout value ({timeout} seconds)")

    return type(
        exception.__name__, (exception,), {"__init__": init, "__module__": exception.__module__}
    )


class WatchdogDeathPenalty(BaseDeathPenalty):
    """RQ's death penalty for a job run on the current thread, enforced by the watchdog."""

    def __init__(
        self, timeout: float, exception: type[BaseException] = JobTimeoutException, **kwargs: Any
    ) -> None:
        super().__init__(timeout, exception, **kwargs)
        self._thread_id = threading.get_ident()
        self._token: int | None = None

    def setup_death_penalty(self) -> None:
        if self._timeout > 0:
            raised = _with_message(self._exception, self._timeout)
            self._token = _WATCHDOG.arm(self._timeout, self._thread_id, raised)

    def cancel_death_penalty(self) -> None:
        if self._token is not None:
            _WATCHDOG.disarm(self._token)
            self._token = None
