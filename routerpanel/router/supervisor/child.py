"""Hold one supervised child's record: what was launched, its process, its timers and flags,
its last lines, and the error text its unexpected exit is reported with.
"""

from __future__ import annotations

import asyncio
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from routerpanel.router.address import LOOPBACK, ChildAddress
from routerpanel.router.supervisor.flood import STATE_BURST, STATE_RATE, LogBudget
from routerpanel.router.supervisor.reports import ChildStateName, LogLine

LAST_LINES = 30


@dataclass(frozen=True, slots=True)
class Launch:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    child_protocol: bool
    load_timeout: float | None
    host: str = LOOPBACK  # what it listens on (--host)
    keyed: bool = False  # a fresh API key for every spawn (issue 18)


@dataclass(eq=False)
class Child:
    launch: Launch
    proc: asyncio.subprocess.Process
    transport: asyncio.SubprocessTransport
    exited_future: asyncio.Future[None]
    port: int
    argv: tuple[str, ...]
    attempt: int
    started: float
    create_time: float | None = None
    state: ChildStateName = "loading"
    ready_at: float | None = None
    stop_requested_at: float | None = None
    stop_deadline: float | None = None
    killed_at: float | None = None
    load_timed_out: bool = False
    bind_failed: bool = False
    cancel_retry: bool = False
    stuck: bool = False
    exited: bool = False
    lines: deque[LogLine] = field(default_factory=lambda: deque(maxlen=LAST_LINES))
    budget: LogBudget = field(default_factory=LogBudget)  # shared by stdout and stderr
    # State lines (child protocol): their own budget, and malformed ones counted, not noted.
    state_budget: LogBudget = field(
        default_factory=lambda: LogBudget(rate=STATE_RATE, burst=STATE_BURST, tokens=STATE_BURST)
    )
    malformed: LogBudget = field(default_factory=lambda: LogBudget(rate=1.0, burst=1.0, tokens=1.0))
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    key: str | None = field(default=None, repr=False)
    key_file: Path | None = None  # holds ``key`` for --api-key-file; removed after the exit

    @property
    def name(self) -> str:
        return self.launch.name

    @property
    def address(self) -> ChildAddress:
        return ChildAddress(self.launch.host, self.port, self.key)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def arm(self, key: str, when: float, callback: Callable[[], None]) -> None:
        if old := self.timers.pop(key, None):
            old.cancel()
        self.timers[key] = asyncio.get_running_loop().call_at(when, callback)

    def disarm(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()


def now() -> float:
    """The loop's clock, which the children's deadlines and timers are in."""
    return asyncio.get_running_loop().time()


def exit_error(child: Child, code: int | None, sig: int | None) -> str:
    if child.load_timed_out:
        return f"load timeout: not ready after {child.launch.load_timeout} s"
    if child.bind_failed and child.ready_at is None:
        return f"could not bind a port after {child.attempt} attempts"
    how = f"exited with code {code}" if sig is None else f"killed by {_signal_name(sig)}"
    return f"{how} {'after it was ready' if child.ready_at is not None else 'while loading'}"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
