"""Stopping an API process's background tasks (the lifespan's loops, the hub's listeners).

Python 3.11's `asyncio.wait_for` swallows a cancellation that arrives as what it waits for
completes (fixed in 3.12), so a loop around one can go on after `cancel()`; awaiting such a
task once hung the lifespan's shutdown. `stop` cancels again until each task ends, and gives
up on one that will not, with a warning, after `STOP_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
_RECANCEL_S = 0.5


async def stop(tasks: Iterable[asyncio.Task[Any]]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_TIMEOUT_S
    pending = {task for task in tasks if not task.done()}
    while pending:
        remaining_s = deadline - loop.time()
        if remaining_s <= 0:
            names = sorted(task.get_name() for task in pending)
            log.warning("background tasks did not stop when cancelled: %s", names)
            return
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(_RECANCEL_S, remaining_s))
