"""Stopping background tasks: one that swallows a cancellation is cancelled again, and one
that never stops is given up on (the lifespan's shutdown never hangs)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tokenrelay.api import background


async def _swallows_one_cancel(stopped: asyncio.Event) -> None:
    """What a loop around Python 3.11's `wait_for` can do: take a cancel for a result."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()
    try:
        await asyncio.Event().wait()
    finally:
        stopped.set()


async def _stops_only_when(released: asyncio.Event) -> None:
    while not released.is_set():
        try:
            await released.wait()
        except asyncio.CancelledError:
            continue


async def test_a_task_that_swallowed_a_cancel_is_cancelled_again() -> None:
    stopped = asyncio.Event()
    task = asyncio.create_task(_swallows_one_cancel(stopped))
    await asyncio.sleep(0)  # let it reach its first wait
    await asyncio.wait_for(background.stop([task]), 5)
    assert stopped.is_set() and task.cancelled()


async def test_a_task_that_never_stops_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(background, "STOP_TIMEOUT_S", 1.0)
    released = asyncio.Event()
    task = asyncio.create_task(_stops_only_when(released), name="stubborn")
    await asyncio.sleep(0)
    await asyncio.wait_for(background.stop([task]), 5)
    assert not task.done()
    assert "stubborn" in caplog.text
    released.set()
    await asyncio.wait_for(task, 5)
