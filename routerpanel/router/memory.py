"""Sample system and per-child memory, and keep a one-hour ring of samples (DESIGN S9).

Sampling is separated from scheduling so tests need no sleeps: ``MemorySampler.sample(now,
children)`` takes one sample at the time the caller passes and stores it; ``run_every`` is a small
loop the engine may own as a task. Sampling reads /proc (or the macOS equivalents) and blocks for
a few milliseconds; call it from a thread (``asyncio.to_thread``) if that matters.

A child's memory is the RSS of its whole process tree (the pid and all descendants), because a
wrapper script or a grandchild can hold the model. Processes that vanish while being read are
skipped silently. On macOS psutil reports ``wired`` (memory the kernel cannot page out, where
Metal buffers live); elsewhere it is None.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs: types-psutil


@dataclass(frozen=True, slots=True)
class SystemMemory:
    total: int
    available: int
    used: int
    swap_total: int
    swap_used: int
    wired: int | None  # macOS only


@dataclass(frozen=True, slots=True)
class ChildMemory:
    name: str
    pid: int
    rss: int  # bytes, summed over the process tree
    processes: int  # how many processes of the tree were counted


@dataclass(frozen=True, slots=True)
class MemorySample:
    time: float  # the caller's clock
    system: SystemMemory
    children: tuple[ChildMemory, ...]

    def child(self, name: str) -> ChildMemory | None:
        return next((c for c in self.children if c.name == name), None)

    @property
    def children_rss(self) -> int:
        return sum(c.rss for c in self.children)


def system_memory() -> SystemMemory:
    """Read system-wide memory now."""
    vm = psutil.virtual_memory()
    swap = psutil.swap_memory()
    wired = getattr(vm, "wired", None)
    return SystemMemory(
        total=int(vm.total),
        available=int(vm.available),
        used=int(vm.used),
        swap_total=int(swap.total),
        swap_used=int(swap.used),
        wired=None if wired is None else int(wired),
    )


def process_tree_rss(pid: int) -> tuple[int, int] | None:
    """Return (RSS bytes, process count) of ``pid`` and its descendants, or None if it is gone."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    rss, counted = _sum_rss(tree)
    return (rss, counted) if counted else None


def _sum_rss(processes: Iterable[psutil.Process]) -> tuple[int, int]:
    total = counted = 0
    for proc in processes:
        try:
            total += int(proc.memory_info().rss)
        except psutil.Error:  # vanished (or became inaccessible) between listing and reading
            continue
        counted += 1
    return total, counted


def children_memory(children: Mapping[str, int]) -> tuple[ChildMemory, ...]:
    """Measure each named child's process tree; children that are gone are left out."""
    result = []
    for name, pid in children.items():
        measured = process_tree_rss(pid)
        if measured is not None:
            result.append(ChildMemory(name, pid, *measured))
    return tuple(result)


class MemorySampler:
    """Take samples and keep the last ``window`` seconds of them (default one hour at 1 s).

    Owned by the engine; not thread-safe (one caller at a time).
    """

    def __init__(
        self,
        *,
        interval: float = 1.0,
        window: float = 3600.0,
        read_system: Callable[[], SystemMemory] = system_memory,
        read_children: Callable[[Mapping[str, int]], tuple[ChildMemory, ...]] = children_memory,
    ) -> None:
        if interval <= 0 or window < interval:
            raise ValueError("need 0 < interval <= window")
        self.interval = interval
        self._ring: deque[MemorySample] = deque(maxlen=math.ceil(window / interval))
        self._read_system = read_system
        self._read_children = read_children

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    def sample(self, now: float, children: Mapping[str, int]) -> MemorySample:
        """Take one sample stamped ``now``, store it (evicting the oldest) and return it."""
        taken = MemorySample(now, self._read_system(), self._read_children(children))
        self._ring.append(taken)
        return taken

    def samples(self, since: float | None = None) -> list[MemorySample]:
        """Return the stored samples, oldest first, optionally only those at or after ``since``."""
        return [s for s in self._ring if since is None or s.time >= since]

    def latest(self) -> MemorySample | None:
        return self._ring[-1] if self._ring else None

    def __len__(self) -> int:
        return len(self._ring)


async def run_every(
    interval: float,
    callback: Callable[[float], Awaitable[None] | None],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Call ``callback(now)`` every ``interval`` seconds until cancelled, without drift.

    Ticks missed because a callback ran long are skipped, not bunched up.
    """
    next_tick = clock()
    while True:
        outcome = callback(clock())
        if outcome is not None:
            await outcome
        next_tick += interval
        now = clock()
        if next_tick < now:
            next_tick = now + interval - (now - next_tick) % interval
        await asyncio.sleep(next_tick - now)
