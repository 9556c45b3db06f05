"""The stop rows that wait: a stop (eviction, unload, TTL, reload, shutdown, a hung child's kill)
gives one row that waits for the victim's ``model.exited`` (stop duration, force-kill, exit
code), then for the next memory sample (memory after) and, in memory mode, for the settle gate
(``memory.settled``). It is written incomplete, with the missing parts named in
``details["incomplete"]``, when they do not come in time. While it waits it is *pending*:
``on_pending`` hears of it at once, so the journal holds it before the stop is carried out.

Owned by the router's loop: not thread-safe, never blocks, no I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models_app.audit.rows import Row, row
from models_app.models import AuditKind
from routerpanel.router.decisions import StopReason

STOP_GRACE = 60.0  # seconds past a stop-timeout before a stop row is written without its exit
AFTER_EXIT = 30.0  # seconds after the exit to wait for memory after and the settle gate
EVICTIONS = (StopReason.EVICTION, StopReason.SHRINK)


@dataclass
class Stop:
    """A stop row waiting for the victim's exit (and then memory after, settle)."""

    row: Row
    action: str  # "stop": asked, SIGKILL at the deadline (S4); "kill": SIGKILL at once
    reason: StopReason
    deadline: float  # wall clock: write it incomplete after this
    waiting: set[str] = field(default_factory=lambda: {"exit"})
    exit_time: float | None = None
    timer: asyncio.TimerHandle | None = None


class Stops:
    """The stop rows waiting, one per model; ``emit`` gets each one finished (see module doc)."""

    def __init__(
        self,
        emit: Callable[[Row], None],
        *,
        on_pending: Callable[[Row, list[str]], None],
        settle_expected: Callable[[], bool],
        stop_grace: float = STOP_GRACE,
        after_exit: float = AFTER_EXIT,
    ) -> None:
        self._emit = emit
        self._on_pending = on_pending
        self._settle_expected = settle_expected
        self.stop_grace = stop_grace
        self.after_exit = after_exit
        self._stops: dict[str, Stop] = {}

    def get(self, model: str) -> Stop | None:
        """The stop of ``model`` whose row waits, if any."""
        return self._stops.get(model)

    def pending(self) -> list[tuple[Row, list[str]]]:
        """The rows still waiting (for the exit, memory after, the settle gate), oldest first."""
        stops = sorted(self._stops.values(), key=lambda s: s.row["seq"])
        return [(stop.row, sorted(stop.waiting)) for stop in stops]

    def wait_for_exit(
        self,
        model: str,
        row: Row,
        action: str,
        reason: StopReason,
        stop_timeout: float | None,
        t: float,
    ) -> None:
        """``row`` waits for ``model``'s exit, at most its stop-timeout and the grace."""
        old = self._stops.pop(model, None)
        if old is not None:  # a new stop before the old one's exit: never lose the old row
            self._finish(model, old, incomplete=True)
        stop = Stop(row, action, reason, deadline=0.0)
        self._stops[model] = stop
        self._on_pending(row, sorted(stop.waiting))  # journaled before the stop is carried out
        self._arm(model, stop, t + (stop_timeout or 0.0) + self.stop_grace)

    def exited(
        self, model: str, stop: Stop, seq: int, t: float, d: dict[str, Any], *, sampling: bool
    ) -> None:
        """The victim exited (``d``: the ``model.exited`` event); ``sampling``: memory samples
        come, so the next one is the row's memory after."""
        stopped = stop.row
        stopped.update(
            to_state=d.get("state") or "unloaded",
            stop_seconds=d.get("stop_seconds"),
            force_killed=bool(d.get("force_killed")),
            exit_code=d.get("exit_code"),
        )
        stopped["details"] |= {"signal": d.get("signal"), "pid": d.get("pid"), "exit_seq": seq}
        if d.get("force_killed") and stop.action == "stop" and d.get("was_ready"):
            timeout = stopped["details"].get("stop_timeout")
            self._emit(
                row(
                    seq,
                    t,
                    AuditKind.FORCE_KILL,
                    model=model,
                    actor=stopped["actor"],
                    from_state=stopped["from_state"],
                    to_state=stopped["to_state"],
                    reason=f"still running at its stop-timeout ({timeout} s): "
                    "SIGKILL to its process group",
                    stop_seconds=d.get("stop_seconds"),
                    force_killed=True,
                    exit_code=d.get("exit_code"),
                    details={
                        "stop_seq": stopped["seq"],
                        "stop_timeout": timeout,
                        "signal": d.get("signal"),
                        "pid": d.get("pid"),
                    },
                )
            )
        stop.waiting.discard("exit")
        stop.exit_time = t
        settle = stop.reason in EVICTIONS and self._settle_expected()
        if settle:
            stop.waiting.add("settle")
        if settle or (sampling and stop.reason is not StopReason.SHUTDOWN):
            stop.waiting.add("memory")  # the sampler runs: the next sample is memory after
        self._arm(model, stop, t + self.after_exit)
        self._maybe_finish(model, stop)

    def sampled(self, system: dict[str, Any] | None, taken: float) -> None:
        """A memory sample taken at ``taken``: memory after for the rows whose victim exited."""
        for name, stop in list(self._stops.items()):
            if "memory" in stop.waiting and stop.exit_time is not None and taken >= stop.exit_time:
                stop.row["memory_after"] = (system or {}).get("used")
                stop.row["details"]["memory_after"] = system
                stop.waiting.discard("memory")
                self._maybe_finish(name, stop)

    def settled(self, d: dict[str, Any]) -> None:
        """The settle gate opened (``d``: the ``memory.settled`` event)."""
        for name, stop in list(self._stops.items()):
            if "settle" in stop.waiting:
                stop.row["settle_seconds"] = d.get("waited")
                stop.row["details"] |= {"settle_by": d.get("by"), "settle_for": d.get("model")}
                stop.waiting.discard("settle")
                self._maybe_finish(name, stop)

    def expire(self, now: float) -> None:
        """Write the stop rows whose deadline has passed, incomplete."""
        for name, stop in list(self._stops.items()):
            if stop.deadline <= now:
                self._finish(name, stop, incomplete=True)

    def finish_all(self) -> None:
        """Write every waiting row now, incomplete (the router is stopping)."""
        for name, stop in list(self._stops.items()):
            self._finish(name, stop, incomplete=True)

    def _arm(self, model: str, stop: Stop, deadline: float) -> None:
        stop.deadline = deadline
        if stop.timer is not None:
            stop.timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test feeding by hand): the next event's expire() checks
        delay = max(0.0, deadline - time.time()) + 0.01
        stop.timer = loop.call_later(delay, lambda: self.expire(time.time()))

    def _maybe_finish(self, model: str, stop: Stop) -> None:
        if not stop.waiting:
            self._finish(model, stop, incomplete=False)

    def _finish(self, model: str, stop: Stop, *, incomplete: bool) -> None:
        if self._stops.get(model) is stop:
            del self._stops[model]
        if stop.timer is not None:
            stop.timer.cancel()
        if incomplete and stop.waiting:
            stop.row["details"]["incomplete"] = sorted(stop.waiting)
        self._emit(stop.row)
