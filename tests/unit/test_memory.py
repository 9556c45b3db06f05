"""Memory sampling (DESIGN S9): the ring, process-tree aggregation, vanished processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.facts import Facts
from routerpanel.router.memory import (
    ChildMemory,
    MemorySample,
    SystemMemory,
    children_memory,
    process_tree_rss,
    system_memory,
)

FAKE_SYSTEM = SystemMemory(total=100, available=60, used=40, swap_total=0, swap_used=0, wired=None)


def fake_children(children: Mapping[str, int]) -> tuple[ChildMemory, ...]:
    return tuple(
        ChildMemory(name, pid, rss=pid * 10, processes=1) for name, pid in children.items()
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


class TestRing:
    """The engine keeps the last hour of samples (facts.py); older ones fall off."""

    def test_it_keeps_one_hour_of_samples_at_the_sampling_interval(self) -> None:
        assert Facts(3600).memory.maxlen == 3600

    def test_it_evicts_the_oldest_sample_when_full(self) -> None:
        facts = Facts(3)
        for now in range(5):
            facts.memory.append(MemorySample(float(now), FAKE_SYSTEM, fake_children({"a": now})))
        assert [s.time for s in facts.memory] == [2.0, 3.0, 4.0]
        assert facts.memory[-1].child("a") == ChildMemory("a", 4, rss=40, processes=1)
        assert facts.memory[-1].children_rss == 40


class TestSystemMemory:
    def test_it_reads_plausible_numbers(self) -> None:
        system = system_memory()
        assert system.total > 0
        assert 0 < system.available <= system.total
        assert system.swap_used <= system.swap_total or system.swap_total == 0
        if sys.platform != "darwin":
            assert system.wired is None


class TestProcessTree:
    def test_it_sums_the_process_and_all_its_descendants(
        self, sleeper: subprocess.Popen[bytes]
    ) -> None:
        me = psutil.Process()
        before = {p.pid for p in me.children(recursive=True)}
        measured = process_tree_rss(os.getpid())
        assert measured is not None
        rss, count = measured
        own = me.memory_info().rss
        sleeper_rss = psutil.Process(sleeper.pid).memory_info().rss
        assert sleeper.pid in before
        assert count >= 2
        assert rss >= own + sleeper_rss * 0.5  # RSS moves a little between reads
        alone = process_tree_rss(sleeper.pid)
        assert alone is not None and alone[1] == 1

    def test_a_vanished_process_is_skipped_silently(self) -> None:
        proc = subprocess.Popen(["true"])
        proc.wait(timeout=10)
        assert process_tree_rss(proc.pid) is None
        result = children_memory({"gone": proc.pid, "me": os.getpid()})
        assert [c.name for c in result] == ["me"]

    def test_a_child_is_reported_with_its_pid(self, sleeper: subprocess.Popen[bytes]) -> None:
        (child,) = children_memory({"sleepy": sleeper.pid})
        assert child.name == "sleepy"
        assert child.pid == sleeper.pid
        assert child.rss > 0
        assert child.processes == 1
