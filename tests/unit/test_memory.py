"""Memory sampling (DESIGN S9): the ring, process-tree aggregation, vanished processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.facts import Facts
from routerpanel.router.memory import (
    ChildMemory,
    MemorySample,
    SystemMemory,
    TreeMemory,
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


class TestTreeMemory:
    """The sampler's trees: measured every sample, listed from /proc every ``rescan`` s."""

    def test_a_tree_is_listed_once_per_rescan_and_measured_every_time(
        self, sleeper: subprocess.Popen[bytes]
    ) -> None:
        now = [0.0]
        trees = TreeMemory(rescan=10.0, clock=lambda: now[0])
        children = {"me": os.getpid(), "sleepy": sleeper.pid}
        first = trees.measure(children)
        assert trees.scans == 2
        for now[0] in (1.0, 5.0, 9.9):
            again = trees.measure(children)
            assert [(c.name, c.processes) for c in again] == [(c.name, c.processes) for c in first]
            assert all(c.rss > 0 for c in again)
        assert trees.scans == 2  # within the rescan: no listing of /proc
        now[0] = 10.0
        trees.measure(children)
        assert trees.scans == 4

    def test_a_process_started_later_is_counted_from_the_next_rescan(self) -> None:
        now = [0.0]
        trees = TreeMemory(rescan=10.0, clock=lambda: now[0])
        parent = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys; sys.stdin.readline();"
             "subprocess.Popen(['sleep', '60']); sys.stdin.readline()"],
            stdin=subprocess.PIPE,
        )  # fmt: skip
        try:
            (alone,) = trees.measure({"p": parent.pid})
            assert alone.processes == 1
            assert parent.stdin is not None
            parent.stdin.write(b"\n")
            parent.stdin.flush()
            proc = psutil.Process(parent.pid)
            for _ in range(200):  # at most 10 s
                if proc.children():
                    break
                time.sleep(0.05)
            assert proc.children(), "the grandchild did not start"
            now[0] = 5.0
            (same,) = trees.measure({"p": parent.pid})
            assert same.processes == 1  # the tree listed at 0 s still holds
            now[0] = 10.0
            (grown,) = trees.measure({"p": parent.pid})
            assert grown.processes == 2
        finally:
            for kid in psutil.Process(parent.pid).children(recursive=True):
                kid.kill()
            parent.kill()
            parent.wait(timeout=10)

    def test_a_child_that_is_gone_is_left_out_at_once_and_forgotten(self) -> None:
        trees = TreeMemory(rescan=1000.0, clock=lambda: 0.0)
        proc = subprocess.Popen(["sleep", "60"])
        (child,) = trees.measure({"gone": proc.pid})
        assert child.pid == proc.pid
        proc.kill()
        proc.wait(timeout=10)
        assert trees.measure({"gone": proc.pid}) == ()  # the cached tree's root is gone
        assert trees.measure({}) == ()
        assert trees._trees == {}
