"""The hang watchdog's side in the engine: who is due a probe, the probe, and the kill.

``watchdog.Watchdog`` decides; ``HangWatch`` gives it the busy models (loaded, requests in
flight, a hang timeout), runs each probe as a task that posts ``ProbeDone`` back to the inbox,
and on a "hung" verdict ends the model's leases with a clear error and has the effects kill
the child (S4). It is one of the engine's parts (parts.py): it owns the watchdog and the probes
in flight, and is handed the presets, the scheduler, the callers and facts it reads.
"""

from __future__ import annotations

import asyncio
import math

from routerpanel.router import commands, watchdog
from routerpanel.router.callers import Callers
from routerpanel.router.errors import RouterError
from routerpanel.router.facts import Facts
from routerpanel.router.parts import Actuator, Clock, Post, Prober
from routerpanel.router.presettable import PresetTable
from routerpanel.router.scheduler import Scheduler


class HangWatch:
    """The engine's hang watch (see module doc); the ``Watch`` of parts.py."""

    def __init__(
        self,
        *,
        presets: PresetTable,
        scheduler: Scheduler,
        callers: Callers,
        facts: Facts,
        effects: Actuator,
        post: Post,
        clock: Clock,
        prober: Prober,
    ) -> None:
        self._presets, self._scheduler = presets, scheduler
        self._callers, self._facts, self._effects = callers, facts, effects
        self._post, self._clock, self._prober = post, clock, prober
        self._watchdog = watchdog.Watchdog()
        self._probes: set[asyncio.Task[None]] = set()
        self._watched_specs: object = None  # the spec table _any_watched was computed for
        self._any_watched = False

    def next_deadline(self) -> float | None:
        busy = self._busy()
        return self._watchdog.next_deadline(busy) if busy else None

    def probe_due(self, now: float) -> None:
        for name in self._watchdog.due(self._busy(), now):
            self._start_probe(name)

    async def close(self) -> None:
        """Cancel the probes in flight and await them (shutdown)."""
        probes = list(self._probes)
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)

    def _busy(self) -> list[watchdog.Busy]:
        """Loaded models with requests in flight and a hang timeout: the watchdog's charges.

        None at all, without a look at the leases, while no preset has a hang timeout: the
        engine asks after every command (to arm its timer).
        """
        specs = self._presets.current
        if specs is not self._watched_specs:  # a new table (start, reload)
            self._watched_specs = specs
            self._any_watched = any(spec.hang_timeout for spec in specs.values())
        if not self._any_watched:
            return []
        out = []
        for name, (_, last, instance) in self._callers.in_flight().items():
            spec = specs.get(name)
            if spec is not None and spec.hang_timeout and self._scheduler.loaded(name):
                out.append(watchdog.Busy(name, spec.hang_timeout, last, instance))
        return out

    def _start_probe(self, name: str) -> None:
        child = self._facts.child(name)
        port, address = child.port, child.address
        spec = self._presets.current.get(name)
        if port is None or spec is None or not spec.hang_timeout:
            return
        timeout = watchdog.probe_gap(spec.hang_timeout)

        async def run() -> None:
            started = self._clock()
            reading = await self._prober(address, timeout)  # /slots wants the key
            self._post(commands.ProbeDone(name, port, reading, self._clock() - started))

        task = asyncio.create_task(run(), name=f"probe {name}")
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def on_probe(self, done: commands.ProbeDone) -> None:
        spec = self._presets.current.get(done.model)
        if spec is None or not spec.hang_timeout:
            return
        now = self._clock()
        verdict = self._watchdog.judge(
            done.model, done.instance, done.reading, now, spec.hang_timeout
        )
        if verdict is not watchdog.Verdict.HUNG:
            return
        busy = self._callers.in_flight().get(done.model)
        idle = now - busy[1] if busy is not None else spec.hang_timeout
        if done.reading is None:
            how = f"no answer to GET /slots within {done.seconds:.1f} s"
        else:
            gap = watchdog.probe_gap(spec.hang_timeout)
            how = f"its progress counters did not move in {gap:g} s"
        self._kill_hung(done.model, idle, how)

    def _kill_hung(self, name: str, idle: float, how: str) -> None:
        """End the hung child's requests with a clear error, then SIGKILL its group (S4)."""
        facts = self._facts.child(name)
        holders = self._callers.holders().get(name, {})
        # The exit will be a crash-loop strike if the child was up only briefly: then the next
        # start waits out a back-off, and the clients are told so rather than "next request".
        now = self._clock()
        hold = self._scheduler.backoff_if_died(name, now=now)
        if hold is None:
            then = "the next request starts it again"
        else:
            then = f"a request starts it again after a back-off of {hold:g} s"
        text = (
            f"model name={name} stopped responding (no progress for {idle:.0f} s) and was "
            f"killed; {then}"
        )
        self._effects.hung(name, {
            "model": name, "pid": facts.pid, "port": facts.port, "idle_seconds": round(idle, 3),
            "in_flight": sum(holders.values()), "holders": holders, "probe": how,
        })  # fmt: skip
        error = RouterError(503, "unavailable_error", text, retry_after=math.ceil(hold or 1))
        ended = self._callers.revoke(name, error)
        self._effects.apply(self._scheduler.child_hung(name, now=now))
        for request_id in ended:
            self._effects.apply(self._scheduler.request_finished(request_id, now=now))
