"""``SingleFlight``: one call at a time, shared by its callers (models_app/singleflight.py)."""

from __future__ import annotations

import asyncio

import pytest

from models_app.routing.singleflight import SingleFlight
from tests.support.waits import settled


async def turns(n: int = 3) -> None:
    """Let the loop run the tasks just started (a caller, then the call it starts)."""
    for _ in range(n):
        await asyncio.sleep(0)


class Counted:
    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self) -> int:
        self.calls += 1
        await self.release.wait()
        return self.calls


async def test_callers_that_arrive_while_a_call_runs_share_it() -> None:
    flight: SingleFlight[int] = SingleFlight()
    start = Counted()
    waiting = [asyncio.ensure_future(flight.run(start)) for _ in range(5)]
    await turns()
    assert flight.running and start.calls == 1
    start.release.set()
    assert await asyncio.gather(*waiting) == [1] * 5
    assert not flight.running
    assert await flight.run(start) == 2  # once it has ended, the next run starts a new call


async def test_a_cancelled_caller_leaves_the_call_running_for_the_others() -> None:
    flight: SingleFlight[int] = SingleFlight()
    start = Counted()
    leaving = asyncio.ensure_future(flight.run(start))
    staying = asyncio.ensure_future(flight.run(start))
    await turns()
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await settled(leaving)
    assert flight.running
    start.release.set()
    assert await settled(staying) == 1
    assert start.calls == 1


async def test_every_caller_gets_the_calls_exception_and_the_next_run_tries_again() -> None:
    flight: SingleFlight[int] = SingleFlight()
    gate = asyncio.Event()
    attempts = 0

    async def failing() -> int:
        nonlocal attempts
        attempts += 1
        await gate.wait()
        raise ConnectionError("away")

    waiting = [asyncio.ensure_future(flight.run(failing)) for _ in range(3)]
    await turns()
    gate.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError] * 3
    assert attempts == 1 and not flight.running
    with pytest.raises(ConnectionError):
        await flight.run(failing)
    assert attempts == 2
