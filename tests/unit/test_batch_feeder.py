"""The batch feeder's pace: ten claims a second while it holds batches, one while it holds
none, and at once when this process records a batch (no Redis: `_wait` alone)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

import pytest

from tokenrelay.api.batches.feeder import IDLE_TICK_S, TICK_S, BatchFeeder
from tokenrelay.api.metrics import Metrics
from tokenrelay.api.state import AppState


def feeder(held: list[str]) -> BatchFeeder:
    state = cast(AppState, SimpleNamespace(batch_created=asyncio.Event()))
    batch_feeder = BatchFeeder(state, cast(Metrics, None))
    batch_feeder.held = held
    return batch_feeder


async def test_an_idle_feeder_waits_longer_than_a_tick() -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(5 * TICK_S):
            await feeder([])._wait()
    assert IDLE_TICK_S >= 10 * TICK_S


async def test_a_feeder_holding_a_batch_waits_one_tick() -> None:
    async with asyncio.timeout(IDLE_TICK_S / 2):
        await feeder(["batch_1"])._wait()


async def test_a_batch_recorded_here_wakes_the_idle_feeder_at_once() -> None:
    idle = feeder([])
    waiting = asyncio.create_task(idle._wait())
    idle.state.batch_created.set()
    async with asyncio.timeout(TICK_S):
        await waiting
    assert not idle.state.batch_created.is_set()  # the next idle wait waits again
