"""Post to the engine's inbox when time says so: ``Timer`` (deadlines) and ``sample_memory``.

Neither polls the engine's state: the engine arms the timer with its earliest deadline after
every command (STYLE 4: deadlines are data), and the sampler posts a sample every interval or at
once when asked (S9).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from routerpanel.router.commands import MemorySampled, Tick
from routerpanel.router.memory import TreeMemory, system_memory


class Timer:
    """Post one ``Tick`` when the earliest deadline passes: sleep until then, never poll.

    The engine calls ``arm`` after every command with the earliest of the scheduler's
    ``next_deadline()`` and the lease expiries (STYLE 4: deadlines are data).

    Only an earlier deadline than the one it sleeps until wakes the sleeper. A later one, or
    none, is read when it wakes anyway (and it sleeps on to it): under load the deadline moves
    with every request (the hang watchdog's "last byte + hang timeout"), and waking to re-arm
    twice per request cost more than the request's own scheduling (issue 16.5).
    """

    def __init__(self, clock: Callable[[], float], post: Callable[[Tick], None]) -> None:
        self.deadline: float | None = None
        self._clock, self._post = clock, post
        self._wake = asyncio.Event()
        self._until: float | None = None  # what the sleeper waits for; None: until woken
        self.wakes = 0  # times arm() woke the sleeper (tests)

    def arm(self, deadline: float | None) -> None:
        if deadline == self.deadline:  # an unchanged deadline must not post another tick
            return
        self.deadline = deadline
        if deadline is not None and (self._until is None or deadline < self._until):
            self.wakes += 1
            self._wake.set()

    def nudge(self) -> None:
        """Look at the clock again (it jumped: a fake clock in tests, a suspended machine)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.deadline
            if deadline is not None and deadline <= self._clock():
                self._until = None
                self._post(Tick())
                await self._wake.wait()  # handling the tick re-arms the timer
                continue
            self._until = deadline
            delay = None if deadline is None else deadline - self._clock()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()


async def sample_memory(
    interval: float,
    pids: Callable[[], dict[str, int]],
    post: Callable[[MemorySampled], None],
    soon: asyncio.Event,
) -> None:
    """Post a memory sample every ``interval`` seconds, or at once when ``soon`` is set (S9).

    Reading /proc blocks for a few milliseconds, so it runs in a thread, off the engine's loop;
    the children's process trees are listed again every ten seconds, not every sample.
    """
    trees = TreeMemory()
    while True:
        post(await asyncio.to_thread(_measure, pids(), trees))
        soon.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await soon.wait()


def _measure(pids: dict[str, int], trees: TreeMemory) -> MemorySampled:
    return MemorySampled(system_memory(), trees.measure(pids))
