"""Simulate the model: resident weights, the load → ready ⇄ sleeping cycle (ROUTER_SPEC §13)
and llama.cpp's parallel slots.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

from routerpanel.router.simserver.common import JSON, log
from routerpanel.router.simserver.options import SimOptions
from routerpanel.router.simserver.protocol import Reporter

MIB = 1 << 20
FAIL_LOAD_AT = 0.5  # --sim-fail-load gives up halfway through the simulated load
LOAD_STEP_S = 0.05
PROGRESS_EVERY_S = 0.2  # llama.cpp throttles loading progress to one line per 200 ms (§4.9)


class Weights:
    """Hold real resident memory standing in for model weights (--sim-rss-mb).

    Anonymous mmaps, every page written, so the memory shows up in RSS and returns to the OS
    when released. Used by one thread at a time: SimModel's states serialise load, sleep and wake.
    """

    CHUNK = 8 * MIB

    def __init__(self, total_bytes: int) -> None:
        self._total = total_bytes
        self._chunks: list[mmap.mmap] = []
        self._held = 0

    def grow_to(self, fraction: float) -> None:
        target = int(self._total * min(fraction, 1.0))
        while self._held < target:
            size = min(self.CHUNK, self._total - self._held)
            chunk = mmap.mmap(-1, size)
            chunk[:: mmap.PAGESIZE] = b"\x01" * len(range(0, size, mmap.PAGESIZE))
            self._chunks.append(chunk)
            self._held += size

    def release(self) -> None:
        for chunk in self._chunks:
            chunk.close()
        self._chunks.clear()
        self._held = 0


class LoadFailed(Exception):
    """--sim-fail-load: the simulated model file cannot be loaded."""


class State(Enum):
    LOADING = "loading"  # first load; HTTP answers 503
    READY = "ready"
    SLEEPING = "sleeping"
    WAKING = "waking"  # reloading after sleep; requests that need the model wait


class SimModel:
    """Own the simulated weights and the load → ready ⇄ sleeping cycle (ROUTER_SPEC §13).

    All state sits behind one condition variable. ``busy()`` wraps each request that needs the
    model: it wakes a sleeping model first (blocking the caller meanwhile), and while any such
    request is in flight the idle clock does not run.
    """

    def __init__(self, opts: SimOptions, reporter: Reporter, stopping: threading.Event) -> None:
        self._opts = opts
        self._reporter = reporter
        self._stopping = stopping
        self._weights = Weights(opts.rss_mb * MIB)
        self._cond = threading.Condition()
        self._state = State.LOADING
        self._in_flight = 0
        self._last_active = time.monotonic()

    @property
    def loaded(self) -> bool:
        """True once the first load finished, sleeping included (llama-server's is_ready)."""
        return self._state is not State.LOADING

    @property
    def sleeping(self) -> bool:
        return self._state in (State.SLEEPING, State.WAKING)

    def load(self) -> bool:
        """Run the first load on the calling thread; False if an exit was requested meanwhile.

        Raises LoadFailed with --sim-fail-load.
        """
        if not self._run_load(self._opts.fail_load):
            return False
        with self._cond:
            self._state = State.READY
            self._last_active = time.monotonic()
            self._cond.notify_all()
        return True

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Hold the model awake for one request, waking it first if it sleeps."""
        if self._enter():
            self._wake()
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._last_active = time.monotonic()
                self._cond.notify_all()

    def watch_idle(self, idle_s: float) -> None:
        """Put the model to sleep after ``idle_s`` seconds without requests (own thread)."""
        with self._cond:
            while not self._stopping.is_set():
                if self._state is not State.READY or self._in_flight:
                    self._cond.wait()
                    continue
                remaining = self._last_active + idle_s - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                # ready -> sleeping: tell the router first, then free (llama.cpp's order, §13.2)
                self._state = State.SLEEPING
                self._reporter.send("sleeping", {})
                self._weights.release()
                log.info("server is entering sleeping state")

    def _enter(self) -> bool:
        """Count one request in; return True if this caller must wake the model."""
        with self._cond:
            while self._state is State.WAKING:
                self._cond.wait()
            self._in_flight += 1
            if self._state is not State.SLEEPING:
                return False
            self._state = State.WAKING
            return True

    def _wake(self) -> None:
        log.info("server is exiting sleeping state")
        self._run_load(fail=False)
        self._reporter.send("ready", {})  # payload {} after a wake-up (ROUTER_SPEC 4.9)
        with self._cond:
            self._state = State.READY
            self._cond.notify_all()

    def _run_load(self, fail: bool) -> bool:
        """Grow the weights over --sim-load-ms with throttled progress; False if told to stop."""
        duration = self._opts.load_ms / 1000
        started = last_report = time.monotonic()
        self._reporter.progress(0.0)
        while True:
            elapsed = time.monotonic() - started
            fraction = 1.0 if duration <= 0 else min(elapsed / duration, 1.0)
            if fail and fraction >= FAIL_LOAD_AT:
                raise LoadFailed(f"failed to load model, '{self._opts.model}'")
            self._weights.grow_to(fraction)
            if fraction >= 1.0:
                break
            if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                self._reporter.progress(round(fraction, 3))
                last_report = time.monotonic()
            if self._stopping.wait(min(LOAD_STEP_S, duration - elapsed)):
                return False
        self._reporter.progress(1.0)
        return True


class SlotPool:
    """Hand out llama.cpp's parallel slots; a request waits (is deferred) while all are busy.

    Each slot keeps llama-server's progress counters for ``GET /slots`` (``id_task``, prompt
    tokens processed, tokens decoded): the router's hang watchdog compares two readings.
    """

    def __init__(self, count: int, n_ctx: int) -> None:
        self._cond = threading.Condition()
        self._busy = [False] * count
        self._deferred = 0
        self._n_ctx = n_ctx
        self._tasks = 0
        self._progress: list[dict[str, int] | None] = [None] * count

    @property
    def count(self) -> int:
        return len(self._busy)

    @contextmanager
    def hold(self, n_prompt: int = 0) -> Iterator[int]:
        with self._cond:
            self._deferred += 1
            while all(self._busy):
                self._cond.wait()
            self._deferred -= 1
            slot = self._busy.index(False)
            self._busy[slot] = True
            self._tasks += 1
            self._progress[slot] = {"id_task": self._tasks, "n_prompt": n_prompt, "done": 0, "n": 0}
        try:
            yield slot
        finally:
            with self._cond:
                self._busy[slot] = False
                self._cond.notify()

    def prompt_processed(self, slot: int, n: int) -> None:
        with self._cond:
            if (p := self._progress[slot]) is not None:
                p["done"] = n

    def decoded(self, slot: int) -> None:
        with self._cond:
            if (p := self._progress[slot]) is not None:
                p["n"] += 1

    def counts(self) -> tuple[int, int]:
        """Return (processing, deferred)."""
        with self._cond:
            return sum(self._busy), self._deferred

    def to_json(self) -> list[JSON]:
        with self._cond:
            busy = list(self._busy)
            progress = [dict(p) if p is not None else None for p in self._progress]
        out: list[JSON] = []
        for i, (b, p) in enumerate(zip(busy, progress, strict=True)):
            slot: JSON = {"id": i, "n_ctx": self._n_ctx, "speculative": False, "is_processing": b}
            if p is not None:  # llama-server shows the current (or previous) task's counters
                slot |= {
                    "id_task": p["id_task"],
                    "n_prompt_tokens": p["n_prompt"],
                    "n_prompt_tokens_processed": p["done"],
                    "n_prompt_tokens_cache": 0,
                    "next_token": [
                        {"has_next_token": b, "has_new_line": False, "n_remain": -1,
                         "n_decoded": p["n"]}
                    ],
                }  # fmt: skip
            out.append(slot)
        return out
