"""The engine's timer: one tick per passed deadline, and no wake-ups for deadlines that only
move later (issue 16.5: under load the hang watchdog's deadline moves with every request)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from routerpanel.router.commands import Tick
from routerpanel.router.timer import Timer

DEADLINE = 5.0


class Ticks:
    def __init__(self) -> None:
        self.at: list[float] = []
        self.event = asyncio.Event()

    def post(self, tick: Tick) -> None:
        self.at.append(time.monotonic())
        self.event.set()


@pytest.fixture
async def timer() -> AsyncIterator[tuple[Timer, Ticks]]:
    ticks = Ticks()
    timer = Timer(time.monotonic, ticks.post)
    task = asyncio.create_task(timer.run())
    await asyncio.sleep(0)  # asleep, with no deadline
    yield timer, ticks
    task.cancel()


async def test_a_later_deadline_does_not_wake_the_sleeper_but_is_kept(
    timer: tuple[Timer, Ticks],
) -> None:
    t, ticks = timer
    start = time.monotonic()
    t.arm(start + 0.05)
    for step in range(1, 21):  # 20 requests, each moving the deadline later
        await asyncio.sleep(0)
        t.arm(start + 0.05 + step * 0.005)
    assert t.wakes == 1  # only the first: from no deadline to one
    async with asyncio.timeout(DEADLINE):
        await ticks.event.wait()
    assert ticks.at[0] - start >= 0.15 - 0.01  # at the last deadline, not the first


async def test_an_earlier_deadline_wakes_it_at_once(timer: tuple[Timer, Ticks]) -> None:
    t, ticks = timer
    start = time.monotonic()
    t.arm(start + 60)
    await asyncio.sleep(0)
    t.arm(start + 0.02)
    assert t.wakes == 2
    async with asyncio.timeout(DEADLINE):
        await ticks.event.wait()
    assert ticks.at[0] - start < 1.0


async def test_a_cleared_deadline_posts_no_tick(timer: tuple[Timer, Ticks]) -> None:
    t, ticks = timer
    t.arm(time.monotonic() + 0.03)
    await asyncio.sleep(0)
    t.arm(None)
    await asyncio.sleep(0.15)  # past the cleared deadline: the sleeper woke and slept on
    assert ticks.at == []


async def test_a_tick_is_posted_once_until_the_deadline_changes(
    timer: tuple[Timer, Ticks],
) -> None:
    t, ticks = timer
    due = time.monotonic() + 0.01
    t.arm(due)
    async with asyncio.timeout(DEADLINE):
        await ticks.event.wait()
    t.arm(due)  # the engine re-arms with the same deadline after the tick: no second tick
    await asyncio.sleep(0.05)
    assert len(ticks.at) == 1
    ticks.event.clear()
    t.arm(time.monotonic() + 0.01)  # a new deadline after a tick wakes it again
    async with asyncio.timeout(DEADLINE):
        await ticks.event.wait()
    assert len(ticks.at) == 2
