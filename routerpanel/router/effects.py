"""Carry out the scheduler's decisions, and mirror what the supervisor reports (DESIGN §4).

Decisions are applied in order: a ``StateChanged`` is published with the spawn, stop or kill
after it (its trigger), then that action runs — Spawn in a child task (a spawn that fails is
reported as an exit), Stop/Kill at once, Grant and Reject by answering the caller's future.
A victim's exit and its replacement's spawn are one step of one loop (A6). Every event is
published before its decision takes effect, so the audit journal holds it first.

``Effects`` is one of the engine's parts (parts.py): it keeps the spawns in flight, the kills
owed to a spawn still in flight, the queue entries already published and the hang watch's
findings until their kill; the scheduler, supervisor, callers and facts are handed to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import deque
from typing import Any

from routerpanel.router import decisions, payloads, supervisor
from routerpanel.router.callers import Callers
from routerpanel.router.catalogue import Event, ModelStateData
from routerpanel.router.config import PresetSpec
from routerpanel.router.errors import RouterError
from routerpanel.router.facts import Facts
from routerpanel.router.parts import Clock, Emit, Post, wall_clock
from routerpanel.router.presettable import PresetTable
from routerpanel.router.scheduler import Scheduler
from routerpanel.router.states import QUARANTINED

log = logging.getLogger(__name__)
EVICTIONS = (decisions.StopReason.EVICTION, decisions.StopReason.SHRINK)
HUNG = decisions.StopReason.HUNG


class Effects:
    """The engine's actuator (see module doc); the ``Actuator`` of parts.py."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        supervisor: supervisor.Supervisor,
        callers: Callers,
        facts: Facts,
        presets: PresetTable,
        emit: Emit,
        post: Post,
        clock: Clock,
        sample_soon: asyncio.Event,
    ) -> None:
        self._scheduler, self._supervisor = scheduler, supervisor
        self._callers, self._facts, self._presets = callers, facts, presets
        self._emit, self._post, self._clock = emit, post, clock
        self._wall = wall_clock(clock)
        self._sample_soon = sample_soon  # the memory sampler's "sample now" (settle gate)
        self._spawning: dict[str, asyncio.Task[None]] = {}  # until ChildStarted or the exit
        self._kill_on_start: set[str] = set()  # Kill decided while the spawn was in flight
        self._hangs: dict[str, dict[str, Any]] = {}  # model -> the verdict's facts, until killed
        self._tickets: set[int] = set()  # queue entries already published (queue.changed)
        self._request_rows = payloads.RequestRows()  # queued requests' rows, made once each

    @property
    def spawning(self) -> bool:
        return bool(self._spawning)

    def hung(self, name: str, facts: dict[str, Any]) -> None:
        self._hangs[name] = facts

    def forget_gone(self) -> None:
        """Drop what we keep of removed presets once the scheduler has forgotten them (A14)."""
        known = {view.name for view in self._scheduler.models()}
        for name in self._presets.forget_retired(known):
            self._facts.forget(name)
            self._supervisor.forget_logs(name)

    # ---- supervisor events ------------------------------------------------------------------

    def on_log(self, line: supervisor.LogLine) -> None:
        data = {"model": line.name, "stream": line.stream, "text": line.text, "time": line.time}
        self._emit(Event.MODEL_LOG, data)

    def on_started(self, ev: supervisor.ChildStarted) -> None:
        self._spawning.pop(ev.name, None)
        self._facts.started(ev)
        if ev.name in self._kill_on_start:  # S4: killed while its spawn was in flight
            self._supervisor.kill(ev.name)

    def on_state(self, ev: supervisor.ChildState) -> None:
        if ev.state in ("loading", "downloading"):
            self._facts.child(ev.name).progress = ev.payload
            if ev.payload:  # llama.cpp streams these as status_change{loading, progress} (§10.5)
                self._emit(Event.MODEL_PROGRESS, {"model": ev.name, "progress": ev.payload})
        if ev.state != "downloading":
            self.apply(self._scheduler.child_state(ev.name, ev.state, now=self._clock()))

    def on_ready(self, ev: supervisor.ChildReady) -> None:
        self._facts.ready(ev)
        self._callers.receipts.ready(ev.name, ev.load_seconds)
        out = self._scheduler.child_ready(ev.name, now=self._clock())
        note: ModelStateData = {"load_seconds": ev.load_seconds}
        note["loaded_for"] = self._facts.child(ev.name).spawned_for  # who the load was for
        if ev.info:  # the child's /v1/models object, sent with its first ready (ROUTER_SPEC 4.9)
            note["info"] = ev.info
        self.apply(out, note=(ev.name, note))

    def on_stuck(self, ev: supervisor.ChildStuck) -> None:
        state = self._scheduler.model(ev.name).state.value
        self._emit(Event.MODEL_STUCK, payloads.stuck_data(ev, state))
        self.apply(self._scheduler.child_stuck(ev.name, now=self._clock()))

    def on_exited(self, ev: supervisor.ChildExited) -> None:
        """Free the slot (A6): the scheduler may spawn the next model in this same step."""
        self._spawning.pop(ev.name, None)
        self._kill_on_start.discard(ev.name)
        tail = tuple(line.text for line in ev.last_lines)
        now = self._clock()
        before = self._scheduler.model(ev.name).state.value
        out = self._scheduler.child_exited(ev.name, now=now, exit_code=ev.exit_code, log_tail=tail)
        if self._scheduler.config.memory_budget is not None:
            self._sample_soon.set()  # the settle gate waits for a fresh sample
        state = next((v.state.value for v in self._scheduler.models() if v.name == ev.name), None)
        self._emit(Event.MODEL_EXITED, self._facts.exited(ev, state, before))
        self.apply(out)
        self.forget_gone()

    # ---- decisions --------------------------------------------------------------------------

    def apply(
        self, out: list[decisions.Decision], note: tuple[str, ModelStateData] | None = None
    ) -> None:
        """Carry out decisions in order; follow-ups (a grant nobody takes) go last."""
        pending = deque(out)
        while pending:
            decision = pending.popleft()
            if isinstance(decision, decisions.StateChanged):  # paired with the action after it
                nxt = pending[0] if pending else None
                data = payloads.state_data(decision, nxt)
                if note is not None and note[0] == decision.model:
                    data.update(note[1])
                if decision.to_state is QUARANTINED:  # what the quarantined child last said
                    data["log_tail"] = list(self._scheduler.model(decision.model).log_tail)
                if isinstance(nxt, decisions.Spawn) and nxt.model == decision.model:
                    self._facts.child(decision.model).spawned_for = nxt.trigger.actor
                self._facts.child(decision.model).state_since = time.time()
                self._emit(Event.MODEL_STATE, data)
            else:
                pending.extend(self._act(decision))

    def _act(self, decision: decisions.Decision) -> list[decisions.Decision]:
        if isinstance(decision, decisions.Grant):
            address = self._facts.child(decision.model).address
            now = self._clock()
            renewable = self._callers.renewable(decision.request_id)
            expires = now + self._scheduler.config.lease_ttl if renewable else math.inf
            if not self._callers.grant(decision, address, expires, now):  # its caller left (A7)
                return self._scheduler.request_finished(decision.request_id, now=now)
        elif isinstance(decision, decisions.Reject):
            self._callers.reject(decision.request_id, RouterError.from_reject(decision))
        elif isinstance(decision, decisions.Spawn):
            self._spawn(decision)
        elif isinstance(decision, decisions.Stop | decisions.Kill):
            self._stop(decision)
        elif isinstance(decision, decisions.QueueChanged):
            data = payloads.queue_data(decision.entries, self._wall, self._request_rows)
            tickets = {e.ticket for e in decision.entries}
            data["added"] = [e.ticket for e in decision.entries
                             if e.ticket not in self._tickets and not e.restart]  # fmt: skip
            self._tickets = tickets
            self._emit(Event.QUEUE_CHANGED, data)
        elif isinstance(decision, decisions.Settled):
            self._emit(Event.MEMORY_SETTLED, dataclasses.asdict(decision))
        elif isinstance(decision, decisions.BackedOff):
            until = time.time() + decision.seconds
            self._emit(Event.MODEL_BACKOFF, dataclasses.asdict(decision) | {"until": until})
        elif isinstance(decision, decisions.PresetsReloaded):
            self._emit(Event.PRESETS_RELOADED, payloads.reload_data(decision))
        return []

    def _spawn(self, spawn: decisions.Spawn) -> None:
        # unloaded -> loading happened in the scheduler: the slot is real (A6)
        self._facts.spawning(spawn.model, spawn.spec.argv)
        self._callers.receipts.spawning(spawn.model, spawn.trigger.request_id)
        task = asyncio.create_task(self._spawn_child(spawn.spec), name=f"spawn {spawn.model}")
        self._spawning[spawn.model] = task

    async def _spawn_child(self, spec: PresetSpec) -> None:
        """Spawn; a spawn that raises is reported as an exit, as the scheduler expects."""
        config = self._scheduler.config
        try:
            await self._supervisor.spawn(
                spec.name, spec.argv, dict(spec.env),
                child_protocol=spec.speaks_child_protocol, load_timeout=spec.load_timeout,
                host=config.child_host, keyed=config.child_keys,
            )  # fmt: skip
        except Exception as exc:  # no process, but the slot must be freed all the same
            error = str(exc) if isinstance(exc, supervisor.SpawnError) else f"spawn failed: {exc}"
            log.warning("spawning %s failed: %s", spec.name, error)
            self._post(payloads.spawn_failure(spec.name, error))

    def _stop(self, decision: decisions.Stop | decisions.Kill) -> None:
        """Publish who is stopped and why (the audit journals it first), then stop or kill."""
        name = decision.model
        frm = self._scheduler.model(name).state.value
        action = "stop" if isinstance(decision, decisions.Stop) else "kill"
        if decision.reason is decisions.StopReason.EVICTION:  # charged to its cause (17.3)
            self._callers.receipts.evicting(name, decision.trigger.request_id)
        if decision.reason in EVICTIONS:
            data = payloads.eviction_data(decision, self._facts.latest, frm)
            self._emit(Event.MODEL_EVICTED, data)
        elif decision.reason is HUNG:
            hung = self._hangs.pop(name, {"model": name})
            self._emit(Event.MODEL_HUNG, hung | {"from_state": frm, "action": action})
        if isinstance(decision, decisions.Stop):
            done = self._supervisor.stop(name, decision.stop_timeout)  # S4: SIGKILL at deadline
        else:
            done = self._supervisor.kill(name)
        if not done and name in self._spawning:
            self._kill_on_start.add(name)  # its ChildStarted delivers the kill
