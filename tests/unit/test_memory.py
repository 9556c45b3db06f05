"""Memory sampling (DESIGN S9): the ring, process-tree aggregation, vanished processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.memory import (
    ChildMemory,
    MemorySampler,
    SystemMemory,
    children_memory,
    process_tree_rss,
    run_every,
    system_memory,
)

FAKE_SYSTEM = SystemMemory(total=100, available=60, used=40, swap_total=0, swap_used=0, wired=None)


def fake_children(children: Mapping[str, int]) -> tuple[ChildMemory, ...]:
    return tuple(
        ChildMemory(name, pid, rss=pid * 10, processes=1) for name, pid in children.items()
    )


def fake_sampler(**kwargs: float) -> MemorySampler:
    return MemorySampler(read_system=lambda: FAKE_SYSTEM, read_children=fake_children, **kwargs)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


class TestRing:
    def test_it_keeps_one_hour_of_one_second_samples_by_default(self) -> None:
        assert fake_sampler().capacity == 3600

    def test_the_capacity_follows_the_interval(self) -> None:
        assert fake_sampler(interval=2.0).capacity == 1800
        assert fake_sampler(interval=0.5, window=10.0).capacity == 20

    def test_it_evicts_the_oldest_sample_when_full(self) -> None:
        sampler = fake_sampler(interval=1.0, window=3.0)
        for now in range(5):
            sampler.sample(float(now), {})
        assert len(sampler) == 3
        assert [s.time for s in sampler.samples()] == [2.0, 3.0, 4.0]
        latest = sampler.latest()
        assert latest is not None and latest.time == 4.0

    def test_it_filters_samples_by_time(self) -> None:
        sampler = fake_sampler()
        for now in range(10):
            sampler.sample(float(now), {})
        assert [s.time for s in sampler.samples(since=7.0)] == [7.0, 8.0, 9.0]

    def test_a_sample_carries_the_callers_time_and_each_child(self) -> None:
        sample = fake_sampler().sample(123.5, {"a": 1, "b": 2})
        assert sample.time == 123.5
        assert sample.system == FAKE_SYSTEM
        assert sample.child("b") == ChildMemory("b", 2, rss=20, processes=1)
        assert sample.child("missing") is None
        assert sample.children_rss == 30

    def test_an_empty_sampler_has_no_latest_sample(self) -> None:
        assert fake_sampler().latest() is None

    def test_it_refuses_a_window_shorter_than_the_interval(self) -> None:
        with pytest.raises(ValueError):
            MemorySampler(interval=2.0, window=1.0)


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


class TestRunEvery:
    async def test_it_calls_back_with_the_time_until_cancelled(self) -> None:
        seen: list[float] = []
        enough = asyncio.Event()

        async def callback(now: float) -> None:
            seen.append(now)
            if len(seen) == 3:
                enough.set()

        task = asyncio.create_task(run_every(0.001, callback))
        await asyncio.wait_for(enough.wait(), timeout=30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen[:3] == sorted(seen[:3])
        assert seen[2] - seen[0] >= 0.0015
