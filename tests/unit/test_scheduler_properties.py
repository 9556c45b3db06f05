"""Random interleavings against the scheduler's invariants (STYLE "Tests", DESIGN §4 A3-A7).

A small fake world applies the decisions: it tracks which children are live (spawned and not yet
exited), which requests wait and which are in flight, and it delivers readiness, crashes and the
(slow) exits of stopped children whenever hypothesis chooses. After every step it checks:

* live children <= models_max at every instant: every Spawn lands within the cap current at that
  moment (after models_max is lowered, the excess drains and never grows); in memory mode the
  estimates of live children fit the budget the same way (A3, A6);
* no model with a request in flight is told to stop, except by an explicit unload (a reload
  drains first, A14);
* FIFO: no entry is spawned while an older entry still needs a slot (A4); the waiters of one
  model are granted in arrival order;
* the scheduler's view agrees with the world (running set, in-flight counts, waiters), and
  in-flight counts never go negative.

At teardown the world drains (children become ready or exit, requests finish, time passes) and
checks that every waiter ended granted, rejected or cancelled and that in-flight returned to 0.
"""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import (
    Decision,
    Grant,
    Kill,
    Reject,
    RequestKind,
    Spawn,
    Stop,
    StopReason,
)
from routerpanel.router.scheduler import Scheduler
from routerpanel.router.states import DOWN, RUNNING, ModelState

GB = 1 << 30
MODELS = ("m0", "m1", "m2", "m3", "m4")
ESTIMATES = {"m0": 1 * GB, "m1": 2 * GB, "m2": 3 * GB, "m3": 2 * GB, "m4": 1 * GB}
BUDGET = 5 * GB
BUSY_STOP_ALLOWED = {StopReason.UNLOAD, StopReason.SHUTDOWN}


def presets(flavour: dict[str, int]) -> list[PresetSpec]:
    """m1 has a ttl, m4 is pinned; ``flavour`` changes a model's command (for reloads)."""
    return [
        PresetSpec(
            name=name,
            argv=("llama-server", "-m", f"/models/{name}.gguf", "-c", str(4096 + flavour[name])),
            ttl=30.0 if name == "m1" else None,
            pinned=name == "m4",
            memory_estimate=ESTIMATES[name],
        )
        for name in MODELS
    ]


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        models_max=st.integers(1, 3),
        memory=st.booleans(),
        max_wait=st.sampled_from([None, 60.0]),
        max_waiters=st.sampled_from([None, 3]),
    )
    def setup(
        self, models_max: int, memory: bool, max_wait: float | None, max_waiters: int | None
    ) -> None:
        self.config = RouterConfig(
            models_max=models_max,
            memory_budget=BUDGET if memory else None,
            settle_timeout=2.0,
            max_wait=max_wait,
            max_waiters=max_waiters,
        )
        self.flavour = dict.fromkeys(MODELS, 0)
        self.s = Scheduler(presets(self.flavour), self.config)
        self.now = 0.0
        self.ids = itertools.count()
        self.live: set[str] = set()
        self.stop_asked: set[str] = set()
        self.waiting: dict[str, tuple[str, RequestKind]] = {}  # insertion = arrival order
        self.in_flight: dict[str, set[str]] = {name: set() for name in MODELS}
        self.outcome: dict[str, str] = {}

    # ---- the fake world ----------------------------------------------------------------------

    def apply(self, out: list[Decision]) -> None:
        spawned_tickets = []
        for d in out:
            if isinstance(d, Spawn):
                self.on_spawn(d)
                spawned_tickets.append(d.ticket)
            elif isinstance(d, Stop | Kill):
                self.on_stop(d.model, d.reason)
            elif isinstance(d, Grant):
                self.on_grant(d)
            elif isinstance(d, Reject):
                assert d.request_id in self.waiting, f"reject for a non-waiter {d}"
                del self.waiting[d.request_id]
                self.outcome[d.request_id] = "rejected"
        self.check_fifo(spawned_tickets)

    def on_spawn(self, d: Spawn) -> None:
        assert d.model not in self.live, f"two children for {d.model}"
        self.live.add(d.model)
        cap = self.s.config.models_max
        assert cap <= 0 or len(self.live) <= cap, f"A6: {sorted(self.live)} live, cap {cap}"
        budget = self.s.config.memory_budget
        used = sum(ESTIMATES[m] for m in self.live)
        assert budget is None or used <= budget, f"A3: {used} bytes live, budget {budget}"

    def on_stop(self, model: str, reason: StopReason) -> None:
        assert model in self.live, f"stop for {model}, which has no child"
        assert model not in self.stop_asked, f"{model} told to stop twice"
        if reason not in BUSY_STOP_ALLOWED:
            assert not self.in_flight[model], f"A5: busy {model} stopped for {reason}"
        self.stop_asked.add(model)

    def on_grant(self, d: Grant) -> None:
        assert d.request_id in self.waiting, f"grant for a non-waiter {d}"
        model, kind = self.waiting.pop(d.request_id)
        assert (model, kind) == (d.model, d.kind)
        if kind is RequestKind.PROXY:
            waiting = self.waiting.items()
            earlier = [r for r, (m, k) in waiting if (m, k) == (model, kind) and r < d.request_id]
            assert not earlier, f"{d.request_id} granted before {earlier} for {model}"
            self.in_flight[model].add(d.request_id)
        self.outcome[d.request_id] = "granted"

    def check_fifo(self, spawned_tickets: list[int]) -> None:
        """A4: after a step, no entry older than one just spawned still needs a slot."""
        assert spawned_tickets == sorted(spawned_tickets)
        for ticket in spawned_tickets:
            for entry in self.s.queue():
                if entry.ticket < ticket:
                    state = self.s.model(entry.model).state
                    assert state not in DOWN, f"entry {entry} overtaken by ticket {ticket}"

    def rid(self) -> str:
        return f"r{next(self.ids):05d}"  # zero-padded: string order is arrival order

    def state_of(self, model: str) -> ModelState:
        return self.s.model(model).state

    # ---- rules -------------------------------------------------------------------------------

    @rule(
        model=st.sampled_from(MODELS),
        kind=st.sampled_from([RequestKind.PROXY] * 4 + [RequestKind.LOAD]),
    )
    def request(self, model: str, kind: RequestKind) -> None:
        rid = self.rid()
        self.waiting[rid] = (model, kind)
        self.apply(self.s.request_arrived(rid, model, now=self.now, actor="user", kind=kind))

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        flying = sorted((r, m) for m, rs in self.in_flight.items() for r in rs)
        rid, model = data.draw(st.sampled_from(flying))
        self.in_flight[model].discard(rid)
        self.apply(self.s.request_finished(rid, now=self.now))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[rid]
        self.outcome[rid] = "cancelled"
        self.apply(self.s.waiter_left(rid, now=self.now))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), line=st.sampled_from(["ready", "ready", "sleeping", "loading"]))
    def child_line(self, data: st.DataObject, line: str) -> None:
        model = data.draw(st.sampled_from(sorted(self.live)))
        self.apply(self.s.child_state(model, line, now=self.now))  # type: ignore[arg-type]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), code=st.sampled_from([0, 1, 139]))
    def child_exits(self, data: st.DataObject, code: int) -> None:
        """A slow exit after a stop, or a crash while loading or serving."""
        model = data.draw(st.sampled_from(sorted(self.live)))
        self.live.discard(model)
        self.stop_asked.discard(model)
        self.apply(self.s.child_exited(model, now=self.now, exit_code=code, log_tail=("x",)))

    @precondition(lambda self: self.stop_asked)
    @rule(data=st.data())
    def child_stuck(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.stop_asked)))
        if self.state_of(model) is not ModelState.STUCK:
            self.apply(self.s.child_stuck(model, now=self.now))

    @rule(models_max=st.integers(1, 3))
    def settings(self, models_max: int) -> None:
        config = dataclasses.replace(self.s.config, models_max=models_max)
        self.apply(self.s.settings_changed(config, now=self.now))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def unload(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.live)))
        self.apply(self.s.unload(model, now=self.now, actor="operator"))

    @rule(model=st.sampled_from(MODELS))
    def reload_with_a_changed_command(self, model: str) -> None:
        self.flavour[model] += 1
        self.apply(self.s.reload(presets(self.flavour), now=self.now, actor="admin"))

    @precondition(lambda self: self.s.config.memory_budget is not None)
    @rule(slack=st.integers(0, 2 * GB))
    def memory_sample(self, slack: int) -> None:
        available = BUDGET - sum(ESTIMATES[m] for m in self.live) + slack
        self.apply(self.s.memory_sample(available, now=self.now))

    @rule(dt=st.floats(0.1, 45.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.apply(self.s.tick(now=self.now))

    # ---- invariants --------------------------------------------------------------------------

    @invariant()
    def the_scheduler_agrees_with_the_world(self) -> None:
        running = {v.name for v in self.s.models() if v.state in RUNNING}
        assert running == self.live
        for view in self.s.models():
            assert view.in_flight == len(self.in_flight[view.name]) >= 0
            if view.name in self.stop_asked:
                assert view.stopping
        assert sum(e.waiters for e in self.s.queue()) == len(self.waiting)

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        self.drain()
        assert not self.waiting, f"waiters left hanging: {self.waiting}"
        for rids in self.in_flight.values():
            for rid in sorted(rids):
                rids.discard(rid)
                self.apply(self.s.request_finished(rid, now=self.now))
        assert all(v.in_flight == 0 for v in self.s.models())
        assert all(o in {"granted", "rejected", "cancelled"} for o in self.outcome.values())

    def drain(self) -> None:
        """Let the world run to quiescence: ready, exit, finish, let time pass, unpin."""
        for _ in range(200):
            if not self.waiting:
                return
            before = (len(self.waiting), frozenset(self.live), self.now)
            for model in sorted(self.live):
                if model in self.stop_asked:
                    self.live.discard(model)
                    self.stop_asked.discard(model)
                    self.apply(self.s.child_exited(model, now=self.now, exit_code=0))
                elif self.state_of(model) in {ModelState.LOADING, ModelState.SLEEPING}:
                    self.apply(self.s.child_ready(model, now=self.now))
            for rids in self.in_flight.values():
                for rid in sorted(rids):
                    rids.discard(rid)
                    self.apply(self.s.request_finished(rid, now=self.now))
            if self.s.config.memory_budget is not None:
                self.apply(self.s.memory_sample(BUDGET, now=self.now))
            if (len(self.waiting), frozenset(self.live), self.now) == before:
                self.now += 100.0  # settle timeout, max wait
                self.apply(self.s.tick(now=self.now))
                pinned = sorted(m for m in self.live if m == "m4" and m not in self.stop_asked)
                for model in pinned:  # only an operator frees a pinned slot
                    self.apply(self.s.unload(model, now=self.now, actor="operator"))


SchedulerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestScheduler = SchedulerMachine.TestCase
