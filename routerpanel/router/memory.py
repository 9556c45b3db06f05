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

import time
from collections.abc import Callable, Iterable, Mapping
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
    tree = _tree(pid)
    return None if tree is None else _sum_rss(tree)


def _tree(pid: int) -> list[psutil.Process] | None:
    """``pid`` and its descendants, the root first; None if it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return None


def _sum_rss(tree: Iterable[psutil.Process]) -> tuple[int, int] | None:
    """(RSS bytes, processes counted) of a tree whose first process is its root; None when the
    root itself is gone (descendants that vanished are skipped)."""
    total = counted = 0
    for proc in tree:
        try:
            total += int(proc.memory_info().rss)
        except psutil.Error:  # vanished (or became inaccessible) between listing and reading
            if not counted:
                return None
            continue
        counted += 1
    return total, counted


class TreeMemory:
    """Each child's process tree, measured at every sample; which processes make up the tree
    is read again only every ``rescan`` seconds.

    Listing a process's descendants reads the status of every process on the machine
    (psutil builds a parent map from all of /proc), several milliseconds per child on a busy
    host, once a second, in the router's own process; reading the RSS of a process already
    known is one small file. A process that a child starts later is counted from the next
    rescan; a tree whose root is gone is dropped at once.
    """

    def __init__(self, rescan: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.rescan = rescan
        self._clock = clock
        self._trees: dict[int, tuple[float, list[psutil.Process]]] = {}  # root -> (until, tree)
        self.scans = 0  # trees listed from /proc (tests)

    def measure(self, children: Mapping[str, int]) -> tuple[ChildMemory, ...]:
        """Measure each named child's process tree; children that are gone are left out."""
        now = self._clock()
        live = set(children.values())
        self._trees = {pid: known for pid, known in self._trees.items() if pid in live}
        result = []
        for name, pid in children.items():
            known = self._trees.get(pid)
            if known is not None and now < known[0]:
                tree: list[psutil.Process] | None = known[1]
            else:
                tree = _tree(pid)
                self.scans += 1
                if tree is not None:
                    self._trees[pid] = (now + self.rescan, tree)
            measured = None if tree is None else _sum_rss(tree)
            if measured is None:
                self._trees.pop(pid, None)
                continue
            result.append(ChildMemory(name, pid, *measured))
        return tuple(result)


def children_memory(children: Mapping[str, int]) -> tuple[ChildMemory, ...]:
    """Measure each named child's process tree now; children that are gone are left out."""
    return TreeMemory(rescan=0.0).measure(children)
