"""A hypothesis state machine driving the scheduler through random interleavings against
its invariants (STYLE "Tests", DESIGN §4 A3-A7). test_scheduler_properties.py runs it under
the FIFO policy, test_scheduler_fair_properties.py (a subclass) under "fair".

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
* LRU (A5): every eviction (for a queued model, or to shrink to a lowered models_max) stops
  the idle, unpinned, loaded-or-sleeping model not wanted by the queue that was used longest
  ago (ties by name); the world keeps its own ``last_used`` (spawn, ready, grant, finish);
* pin: a pinned model is never stopped by an eviction, a shrink or its ttl;
* TTL (A11): a ttl stop hits only an idle, unpinned model idle for at least its ttl; after a
  tick no such model is left running; ``next_deadline()`` is never later than a ttl that runs;
* the release's fast path decides as the full admission pass does: every input goes to two
  schedulers, one with the fast path off (``Twin``), and their answers must be equal; the
  ``lower_the_limit_under_load`` rule makes the quiet releases that follow shrink (A5);
* the scheduler's view agrees with the world (running set, in-flight counts, waiters,
  ``last_used`` of running models), and in-flight counts never go negative.

models_max is drawn from 0 (unlimited) to 3, at the start and by the ``settings`` rule; the
``pin`` and ``set_ttl`` rules change presets through a reload, as an admin editing them does.
``CHECKED`` counts which checks a run reached.

At teardown the world drains (children become ready or exit, requests finish, time passes) and
checks that every waiter ended granted, rejected or cancelled and that in-flight returned to 0.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable

import pytest
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
EVICTIONS = {StopReason.EVICTION, StopReason.SHRINK}
EVICTABLE = {"loaded", "sleeping"}  # as the world sees its children (states.EVICTABLE)
CHECKED: collections.Counter[str] = collections.Counter()  # which checks a run reached


class FullPass(Scheduler):
    """The scheduler with its release fast path off: every release runs the admission pass."""

    def _finishes_quietly(self) -> bool:
        return False


class Twin:
    """Feed every input to the scheduler and to a ``FullPass`` one and demand equal answers
    (decisions and views alike, or the same exception): the fast path must decide exactly as
    the full admission pass would, on every step the machine takes."""

    def __init__(self, presets: list[PresetSpec], config: RouterConfig) -> None:
        self.fast, self.full = Scheduler(presets, config), FullPass(presets, config)

    @property
    def config(self) -> RouterConfig:
        return self.fast.config

    def grant_at_once(self, request_id: str, model: str, **kw: object) -> bool:
        """The engine's hot path: a grant it makes must be exactly what ``request_arrived``
        answers (one Grant) on the full-pass twin; when it declines, the machine asks
        ``request_arrived`` of both."""
        if not self.fast.grant_at_once(request_id, model, **kw):  # type: ignore[arg-type]
            return False
        answer = self.full.request_arrived(request_id, model, **kw)  # type: ignore[arg-type]
        assert answer == [Grant(request_id, model, RequestKind.PROXY)], answer
        CHECKED["grant at once"] += 1
        return True

    def __getattr__(self, name: str) -> Callable[..., object]:
        fast, full = getattr(self.fast, name), getattr(self.full, name)

        def both(*args: object, **kwargs: object) -> object:
            quiet = name == "request_finished" and self.fast._finishes_quietly()
            try:
                answer = fast(*args, **kwargs)
            except Exception as error:
                with pytest.raises(type(error)):
                    full(*args, **kwargs)
                raise
            assert full(*args, **kwargs) == answer, f"{name}{args}: fast path differs"
            if quiet:
                CHECKED["quiet release"] += 1
            return answer

        return both


def presets(
    flavour: dict[str, int], pinned: set[str], ttl: dict[str, float | None]
) -> list[PresetSpec]:
    """``flavour`` changes a model's command (for reloads); pins and ttls are the world's."""
    return [
        PresetSpec(
            name=name,
            argv=("llama-server", "-m", f"/models/{name}.gguf", "-c", str(4096 + flavour[name])),
            ttl=ttl[name],
            pinned=name in pinned,
            memory_estimate=ESTIMATES[name],
        )
        for name in MODELS
    ]


class SchedulerMachine(RuleBasedStateMachine):
    POLICY = "fifo"  # test_scheduler_fair_properties.py runs this machine under "fair"

    @initialize(
        models_max=st.integers(0, 3),
        memory=st.booleans(),
        max_wait=st.sampled_from([None, 60.0]),
        max_waiters=st.sampled_from([None, 3]),
        warm=st.lists(st.sampled_from(MODELS), unique=True, max_size=3),
    )
    def setup(
        self,
        models_max: int,
        memory: bool,
        max_wait: float | None,
        max_waiters: int | None,
        warm: list[str],
    ) -> None:
        """A fresh router; ``warm`` models are loaded one second apart and left idle."""
        self.config = RouterConfig(
            models_max=models_max,
            memory_budget=BUDGET if memory else None,
            settle_timeout=2.0,
            max_wait=max_wait,
            max_waiters=max_waiters,
            queue_policy=self.POLICY,  # type: ignore[arg-type]
        )
        self.flavour = dict.fromkeys(MODELS, 0)
        self.pinned = {"m4"}
        self.ttl: dict[str, float | None] = {name: None for name in MODELS} | {"m1": 30.0}
        self.s = Twin(self.presets(), self.config)
        self.now = 0.0
        self.ids = itertools.count()
        self.live: set[str] = set()
        self.state: dict[str, str] = {}  # live children: loading, loaded, sleeping or stuck
        self.last_used: dict[str, float] = {}  # set at spawn, ready, grant and finish
        self.queued: set[str] = set()  # models with a queue entry before the current step
        self.stop_asked: set[str] = set()
        self.waiting: dict[str, tuple[str, RequestKind]] = {}  # insertion = arrival order
        self.in_flight: dict[str, set[str]] = {name: set() for name in MODELS}
        self.outcome: dict[str, str] = {}
        for model in warm:
            self.now += 1.0
            self.load_and_ready(model)

    # ---- the fake world ----------------------------------------------------------------------

    def presets(self) -> list[PresetSpec]:
        return presets(self.flavour, self.pinned, self.ttl)

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
        self.queued = {entry.model for entry in self.s.queue()}

    def on_spawn(self, d: Spawn) -> None:
        assert d.model not in self.live, f"two children for {d.model}"
        self.live.add(d.model)
        self.state[d.model] = "loading"
        self.last_used[d.model] = self.now
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
        if reason in EVICTIONS or reason is StopReason.TTL:
            assert model not in self.pinned, f"pinned {model} stopped for {reason}"
            assert self.state[model] in EVICTABLE, f"{self.state[model]} {model} {reason}"
            CHECKED["pinned spared" if self.pinned & self.idle() else "unpinned"] += 1
        if reason in EVICTIONS:
            self.check_lru(model)
        if reason is StopReason.TTL:
            ttl = self.ttl[model]
            assert ttl is not None, f"{model} has no ttl, yet stopped for it"
            idle_for = self.now - self.last_used[model]
            assert idle_for >= ttl, f"A11: {model} idle {idle_for} s < ttl {ttl} s"
            CHECKED["ttl stop"] += 1
        self.stop_asked.add(model)

    def idle(self) -> set[str]:
        """Running children that are idle, loaded or sleeping, and not being stopped."""
        return {
            m for m in self.live - self.stop_asked
            if not self.in_flight[m] and self.state[m] in EVICTABLE
        }  # fmt: skip

    def check_lru(self, victim: str) -> None:
        """A5: the victim is the candidate used longest ago (then by name).

        Candidates are idle, unpinned and not wanted by the queue. "Wanted" is taken wide (an
        entry before this step, or a waiter now), so the check never blames a fair choice.
        """
        wanted = self.queued | {model for model, _ in self.waiting.values()}
        assert victim not in {model for model, _ in self.waiting.values()}, f"{victim} wanted"
        candidates = (self.idle() - self.pinned - wanted) | {victim}
        oldest = min(candidates, key=lambda m: (self.last_used[m], m))
        used = {m: self.last_used[m] for m in sorted(candidates)}
        assert oldest == victim, f"A5: evicted {victim}, not {oldest} (used longest ago): {used}"
        CHECKED["lru choice" if len(candidates) > 1 else "lru only candidate"] += 1

    def on_grant(self, d: Grant) -> None:
        assert d.request_id in self.waiting, f"grant for a non-waiter {d}"
        model, kind = self.waiting.pop(d.request_id)
        assert (model, kind) == (d.model, d.kind)
        self.last_used[model] = self.now
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
        self.arrive(model, kind)

    @precondition(lambda self: not self.queued and "loaded" in self.state.values())
    @rule(data=st.data())
    def request_a_loaded_model(self, data: st.DataObject) -> None:
        """The common case on a shared server, and the engine's hot path: a request for a
        loaded model while nothing waits."""
        loaded = sorted(m for m, state in self.state.items() if state == "loaded")
        self.arrive(data.draw(st.sampled_from(loaded)), RequestKind.PROXY)

    def arrive(self, model: str, kind: RequestKind) -> str:
        rid = self.rid()
        self.waiting[rid] = (model, kind)
        # Every other proxy request tries the engine's hot path first, as the engine does.
        lane = kind is RequestKind.PROXY and int(rid[1:]) % 2 == 0
        if lane and self.s.grant_at_once(rid, model, now=self.now, actor="user"):
            self.apply([Grant(rid, model, kind)])
        else:
            self.apply(self.s.request_arrived(rid, model, now=self.now, actor="user", kind=kind))
        return rid

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        flying = sorted((r, m) for m, rs in self.in_flight.items() for r in rs)
        rid, model = data.draw(st.sampled_from(flying))
        self.end(rid, model)

    def end(self, rid: str, model: str) -> None:
        """A granted request ends: finishing is use too (ROUTER_SPEC §15.26)."""
        self.in_flight[model].discard(rid)
        self.last_used[model] = self.now
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
        self.line(data.draw(st.sampled_from(sorted(self.live))), line)

    def line(self, model: str, line: str) -> None:
        """The child says ``line``: the world moves as the child protocol does (ready is use)."""
        state = self.state[model]
        if line == "ready" and state in ("loading", "sleeping"):
            self.state[model], self.last_used[model] = "loaded", self.now
        elif (line, state) in (("sleeping", "loaded"), ("loading", "sleeping")):
            self.state[model] = line
        self.apply(self.s.child_state(model, line, now=self.now))  # type: ignore[arg-type]

    @rule(model=st.sampled_from(MODELS))
    def load_and_ready(self, model: str) -> None:
        """An explicit load whose child is ready at once: idle models pile up, so evictions
        have several candidates to choose from (A5)."""
        self.arrive(model, RequestKind.LOAD)
        if model in self.live and self.state[model] == "loading":
            self.line(model, "ready")

    @precondition(lambda self: self.live)
    @rule(data=st.data(), code=st.sampled_from([0, 1, 139]))
    def child_exits(self, data: st.DataObject, code: int) -> None:
        """A slow exit after a stop, or a crash while loading or serving."""
        model = data.draw(st.sampled_from(sorted(self.live)))
        self.exited(model)
        self.apply(self.s.child_exited(model, now=self.now, exit_code=code, log_tail=("x",)))

    def exited(self, model: str) -> None:
        self.live.discard(model)
        self.stop_asked.discard(model)
        del self.state[model]

    @precondition(lambda self: self.stop_asked)
    @rule(data=st.data())
    def child_stuck(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.stop_asked)))
        if self.state_of(model) is not ModelState.STUCK:
            self.state[model] = "stuck"
            self.apply(self.s.child_stuck(model, now=self.now))

    @rule(models_max=st.integers(0, 3))
    def settings(self, models_max: int) -> None:
        config = dataclasses.replace(self.s.config, models_max=models_max)
        self.apply(self.s.settings_changed(config, now=self.now))

    @precondition(lambda self: sum(1 for rids in self.in_flight.values() if rids) >= 2)
    @rule()
    def lower_the_limit_under_load(self) -> None:
        """An admin lowers models_max below the models in use: nothing busy may stop, and the
        releases that follow (with nothing queued, the release's fast path) must shrink."""
        busy = sum(1 for rids in self.in_flight.values() if rids)
        self.settings(busy - 1)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def unload(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.live)))
        self.apply(self.s.unload(model, now=self.now, actor="operator"))

    @rule(model=st.sampled_from(MODELS))
    def reload_with_a_changed_command(self, model: str) -> None:
        self.flavour[model] += 1
        self.apply(self.s.reload(self.presets(), now=self.now, actor="admin"))

    @rule(model=st.sampled_from(MODELS), pinned=st.booleans())
    def pin(self, model: str, pinned: bool) -> None:
        """An admin pins or unpins a preset: a reload that restarts nothing."""
        self.pinned = self.pinned | {model} if pinned else self.pinned - {model}
        self.apply(self.s.reload(self.presets(), now=self.now, actor="admin"))

    @rule(model=st.sampled_from(MODELS), ttl=st.sampled_from([None, 5.0, 30.0]))
    def set_ttl(self, model: str, ttl: float | None) -> None:
        self.ttl[model] = ttl
        self.apply(self.s.reload(self.presets(), now=self.now, actor="admin"))

    @rule(model=st.sampled_from(MODELS), dt=st.floats(0.1, 10.0))
    def use_briefly(self, model: str, dt: float) -> None:
        """Some time later, a short request: granted at once if the model serves, it ends at
        once, and the model becomes the most recently used (LRU order moves)."""
        self.now += dt
        rid = self.arrive(model, RequestKind.PROXY)
        if rid in self.in_flight[model]:
            self.end(rid, model)

    @precondition(lambda self: self.s.config.memory_budget is not None)
    @rule(slack=st.integers(0, 2 * GB))
    def memory_sample(self, slack: int) -> None:
        available = BUDGET - sum(ESTIMATES[m] for m in self.live) + slack
        self.apply(self.s.memory_sample(available, now=self.now))

    def lru_candidates(self) -> set[str]:
        return self.idle() - self.pinned - self.queued

    @precondition(
        lambda self: (
            self.s.config.models_max > 0
            and len(self.live) == self.s.config.models_max
            and len(self.lru_candidates()) >= 2
        )
    )
    @rule(data=st.data())
    def ask_for_a_model_that_is_down(self, data: st.DataObject) -> None:
        """At the cap with several idle models: a request for another one must evict the
        least recently used of them (checked in ``check_lru``)."""
        down = sorted(set(MODELS) - self.live - self.queued)
        if down:
            self.arrive(data.draw(st.sampled_from(down)), RequestKind.PROXY)

    @precondition(lambda self: any(self.ttl[m] for m in self.idle() - self.pinned))
    @rule(data=st.data())
    def wait_out_a_ttl(self, data: st.DataObject) -> None:
        """Let the clock reach an idle model's ttl: the tick must stop it (A11)."""
        due = sorted(m for m in self.idle() - self.pinned if self.ttl[m])
        model = data.draw(st.sampled_from(due))
        self.tick(max(0.0, self.last_used[model] + (self.ttl[model] or 0) - self.now))

    @rule(dt=st.floats(0.1, 45.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.apply(self.s.tick(now=self.now))
        for model in self.idle() - self.pinned:  # A11: nothing idle past its ttl survives a tick
            ttl = self.ttl[model]
            idle_for = self.now - self.last_used[model]
            assert ttl is None or idle_for < ttl, f"A11: {model} idle {idle_for} s, ttl {ttl} s"

    # ---- invariants --------------------------------------------------------------------------

    @invariant()
    def the_scheduler_agrees_with_the_world(self) -> None:
        running = {v.name for v in self.s.models() if v.state in RUNNING}
        assert running == self.live
        for view in self.s.models():
            assert view.in_flight == len(self.in_flight[view.name]) >= 0
            if view.name in self.stop_asked:
                assert view.stopping
            if view.name in self.live:
                assert view.last_used == self.last_used[view.name], view
                assert view.pinned == (view.name in self.pinned)
        assert sum(e.waiters for e in self.s.queue()) == len(self.waiting)

    @invariant()
    def the_timer_is_due_no_later_than_any_running_ttl(self) -> None:
        due = [self.last_used[m] + t for m in self.idle() - self.pinned if (t := self.ttl[m])]
        if due:
            deadline = self.s.next_deadline()
            assert deadline is not None and deadline <= min(due), (deadline, due)
            CHECKED["ttl deadline"] += 1

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        self.drain()
        assert not self.waiting, f"waiters left hanging: {self.waiting}"
        for model, rids in self.in_flight.items():
            for rid in sorted(rids):
                self.end(rid, model)
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
                    self.exited(model)
                    self.apply(self.s.child_exited(model, now=self.now, exit_code=0))
                elif self.state_of(model) in {ModelState.LOADING, ModelState.SLEEPING}:
                    self.line(model, "ready")
            for model, rids in self.in_flight.items():
                for rid in sorted(rids):
                    self.end(rid, model)
            if self.s.config.memory_budget is not None:
                self.apply(self.s.memory_sample(BUDGET, now=self.now))
            if (len(self.waiting), frozenset(self.live), self.now) == before:
                self.now += 100.0  # settle timeout, max wait
                self.apply(self.s.tick(now=self.now))
                pinned = sorted(self.live & self.pinned - self.stop_asked)
                for model in pinned:  # only an operator frees a pinned slot
                    self.apply(self.s.unload(model, now=self.now, actor="operator"))


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
