"""Deadlines for what a test awaits: a stuck task fails the test in seconds, with its place."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
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
