"""Deadlines for what a test awaits: a stuck task fails the test in seconds, with its place."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE = 10.0  # seconds: far more than anything a test awaits needs on a busy machine


async def settled(awaitable: Awaitable[T], seconds: float = DEADLINE) -> T:
    """Await ``awaitable`` (a task, a future, a coroutine); fail if it takes over ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise AssertionError(f"still waiting after {seconds} s for {awaitable!r}") from None


async def polled(
    fetch: Callable[[], T],
    until: Callable[[T], bool] = bool,
    seconds: float = DEADLINE,
    what: str = "",
) -> T:
    """Call ``fetch`` (in a thread: it may block) until ``until`` holds for what it returns;
    return that. After ``seconds`` fail, showing the last value."""
    deadline = time.monotonic() + seconds
    while True:
        value = await asyncio.to_thread(fetch)
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"after {seconds} s still not {what or until!r}: {value!r}")
        await asyncio.sleep(0.1)
