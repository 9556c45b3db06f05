"""Read system and per-child memory (DESIGN S9).

The timer (timer.py) reads both in a thread once a second and hands the engine a sample; the
engine keeps the one-hour ring (facts.py). Reading goes through /proc (or the macOS equivalents)
and blocks for a few milliseconds, hence the thread.

A child's memory is the RSS of its whole process tree (the pid and all descendants), because a
wrapper script or a grandchild can hold the model. Processes that vanish while being read are
skipped silently. On macOS psutil reports ``wired`` (memory the kernel cannot page out, where
Metal buffers live); elsewhere it is None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
