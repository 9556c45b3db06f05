"""Random interleavings under ``queue_policy = fair`` (issue 17.5), against its guarantees.

The fake world of tests/support/scheduler_machine.py runs again, unchanged in what it checks —
live children within the cap (A3, A6), no busy model stopped, LRU and pin and TTL, the scheduler
agreeing with the world, every waiter answered at the end — with requests from several owners
in every priority class, and the fair order checked in place of arrival order:

* **priority respected, then least recent use**: when an entry is spawned, no entry that still
  needs a slot has a better claim — a waiter of a higher class, or of the same class whose owner
  used the machine less (recent use as the scheduler reports it; its accounting is checked
  against a brute force in test_fair_share.py), or the same and an older entry;
* **no starvation**: an entry whose oldest waiter waited ``urgent_after(max_wait)`` is never
  overtaken by a newer one (it comes before every entry that is not urgent, oldest first);
* **FIFO within an entry**: one model's waiters are granted in arrival order (the base machine's
  ``on_grant`` check, whatever their owners and classes).

A second test drives a world where high-priority light users keep arriving for other models and
checks that a low-priority heavy user's entry is still served within a bound, and before
``max_wait`` when that is set.
"""

from __future__ import annotations

import collections
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from routerpanel.router.config import RouterConfig
from routerpanel.router.decisions import Grant, Priority, Reject, RequestKind, Spawn
from routerpanel.router.fairshare import RANK, owner_of, urgent_after
from routerpanel.router.scheduler import Scheduler
from routerpanel.router.states import DOWN
from tests.support.scheduler import preset
from tests.support.scheduler_machine import MODELS, SETTINGS, SchedulerMachine

USERS = (
    ("key:ann/batch", Priority.LOW),
    ("key:ann/laptop", Priority.HIGH),
    ("key:bob/ci", Priority.NORMAL),
    ("user:cy", Priority.NORMAL),
    ("key:dee/x", Priority.HIGH),
    ("anonymous", Priority.LOW),
)
Pair = tuple[tuple[str, Priority], tuple[str, Priority]]
PAIRS: list[Pair] = [
    (one, other) for one, other in itertools.permutations(USERS, 2) if one[1] is other[1]
]
FAIR_CHECKED: collections.Counter[str] = collections.Counter()

Key = tuple[int, float, float, int]


class FairSchedulerMachine(SchedulerMachine):
    POLICY = "fair"

    who = USERS[0]

    @rule(user=st.sampled_from(USERS))
    def next_user(self, user: tuple[str, Priority]) -> None:
        """Later requests come from ``user`` (its owner and its key's class)."""
        self.who = user

    @rule(data=st.data(), pair=st.sampled_from(PAIRS))
    def two_owners_of_one_class_ask(self, data: st.DataObject, pair: Pair) -> None:
        """Two owners of one class ask for two models that are down, one after the other: the
        entries share a class, so when one of them is spawned and the other still waits,
        their owners' recent use decides (the "use decided" check, otherwise rare)."""
        down = sorted(set(MODELS) - self.live - self.queued)
        if len(down) < 2:
            return
        models = data.draw(st.permutations(down))[:2]
        who = self.who
        for user, model in zip(pair, models, strict=True):
            self.who = user
            self.arrive(model, RequestKind.PROXY)
        self.who = who

    def arrive(self, model: str, kind: RequestKind) -> str:
        if not hasattr(self, "meta"):
            self.meta: dict[str, tuple[str, Priority, float]] = {}
            self.spawns: list[tuple[str, Key]] = []
            self.before: dict[str, tuple[int, float, bool]] = {}
        rid = self.rid()
        actor, priority = self.who
        self.waiting[rid] = (model, kind)
        self.meta[rid] = (owner_of(actor), priority, self.now)
        out = self.s.request_arrived(
            rid, model, now=self.now, actor=actor, kind=kind, priority=priority
        )
        self.apply(out)
        return rid

    def key(self, model: str, ticket: int, since: float | None, restart: bool) -> Key:
        """The world's own fair key of an entry (its waiters are in ``self.waiting``)."""
        meta = getattr(self, "meta", {})
        mine = [meta[r] for r, (m, _) in self.waiting.items() if m == model and r in meta]
        oldest = min((when for _, _, when in mine), default=since)
        assert oldest is not None
        if oldest <= self.now - urgent_after(self.s.config.max_wait):
            return (0, oldest, 0.0, ticket)
        use = self.s.recent_use(self.now)
        best = [(-RANK[p], use.get(owner, 0.0)) for owner, p, _ in mine]
        if restart:
            best.append((-RANK[Priority.NORMAL], 0.0))
        rank, usage = min(best)
        return (1, rank, usage, ticket)

    def on_spawn(self, d: Spawn) -> None:
        super().on_spawn(d)
        if not hasattr(self, "spawns"):
            return  # warm-up loads in setup, before any check
        _, since, restart = self.before.get(d.model, (d.ticket, None, False))
        self.spawns.append((d.model, self.key(d.model, d.ticket, since, restart)))

    def check_fifo(self, spawned_tickets: list[int]) -> None:
        """Checked instead of arrival order: the fair order (see module doc)."""
        spawns, self.spawns = getattr(self, "spawns", []), []
        keys = [key for _, key in spawns]
        assert keys == sorted(keys), f"spawned out of fair order: {spawns}"
        for model, key in spawns:
            for entry in self.s.queue():
                if entry.model == model or self.s.model(entry.model).state not in DOWN:
                    continue
                other = self.key(entry.model, entry.ticket, entry.since, entry.restart)
                assert not other < key, f"{entry.model} {other} overtaken by {model} {key}"
                FAIR_CHECKED["urgent" if key[0] == 0 else "by class and use"] += 1
                if other[0] == 1 and key[0] == 1 and other[1] != key[1]:
                    FAIR_CHECKED["class decided"] += 1
                if other[0] == 1 and key[0] == 1 and other[1] == key[1] and other[2] != key[2]:
                    FAIR_CHECKED["use decided"] += 1
                if other[0] == 0 or key[0] == 0:
                    FAIR_CHECKED["urgent compared"] += 1
        self.before = {
            e.model: (e.ticket, e.since, e.restart) for e in self.s.queue()
        }  # fmt: skip


FairSchedulerMachine.TestCase.settings = SETTINGS
TestFairScheduler = FairSchedulerMachine.TestCase


def test_a_fixed_fair_run_reaches_every_fair_check() -> None:
    """A change that keeps the machine from comparing urgent entries, classes or uses must fail
    here instead of letting the checks pass on nothing (as the fifo machine's own test)."""
    FAIR_CHECKED.clear()
    reached = {"class decided", "use decided", "urgent compared"}
    runs = [settings(SETTINGS, derandomize=True, database=None)]
    runs += [settings(SETTINGS, derandomize=False, database=None)] * 3
    for run in runs:
        run_state_machine_as_test(FairSchedulerMachine, settings=run)
        if reached <= set(FAIR_CHECKED):
            break
    assert reached <= set(FAIR_CHECKED), f"never reached: {reached - set(FAIR_CHECKED)}"


# ---- no starvation under a stream of higher-priority, lighter users ---------------------------

COMPETITORS = ("c0", "c1", "c2", "c3")


@settings(max_examples=60, deadline=None)
@given(
    max_wait=st.sampled_from([None, 60.0]),
    holds=st.lists(st.floats(0.5, 5.0), min_size=1, max_size=40),
    arrivals=st.lists(st.lists(st.sampled_from(COMPETITORS), max_size=3), min_size=1, max_size=40),
)
def test_a_low_priority_heavy_entry_is_served_within_its_bound_and_before_max_wait(
    max_wait: float | None, holds: list[float], arrivals: list[list[str]]
) -> None:
    """models_max 1. A heavy low-priority user (who used the machine for 10 minutes) waits for
    ``v``; high-priority users with no use keep asking for other models, one round after
    another. By priority and use alone ``v`` would never be served; it must be, within
    ``urgent_after(max_wait)`` plus one round per entry that was older (at most 4, of at most
    5 s each), and never rejected for ``max_wait``."""
    s = Scheduler(
        [preset(m) for m in ("v", "x", *COMPETITORS)],
        RouterConfig(models_max=1, max_wait=max_wait, queue_policy="fair"),  # type: ignore[arg-type]
    )
    now, heavy, ids = 0.0, "key:heavy/batch", itertools.count()
    flying: dict[str, set[str]] = collections.defaultdict(set)  # granted, by model

    def arrive(rid: str, model: str, actor: str, priority: str) -> None:
        out = s.request_arrived(rid, model, now=now, actor=actor, priority=priority)
        assert not [d for d in out if isinstance(d, Reject)], out
        flying[model].update(d.request_id for d in out if isinstance(d, Grant))

    arrive("use", "x", heavy, "low")
    s.child_ready("x", now=now)
    flying["x"].update(["use"])
    now = 600.0
    s.request_finished("use", now=now)  # ten minutes held
    flying["x"].clear()
    for i, model in enumerate(COMPETITORS):  # competitors wait before v arrives
        arrive(f"c-{i}", model, f"key:u{i}/k", "high")
    arrive("victim", "v", heavy, "low")
    since, served_at, running = now, None, "x"
    for hold, new in itertools.islice(zip(itertools.cycle(holds), itertools.cycle(arrivals)), 400):
        # the running model's requests take ``hold`` seconds; then it is evicted for the head
        now += hold
        for model in new:
            arrive(f"n{next(ids)}", model, f"key:n{next(ids)}/k", "high")
        out = s.tick(now=now)
        for rid in sorted(flying.pop(running, set())):
            out += s.request_finished(rid, now=now)
        out += s.child_exited(running, now=now, exit_code=0)
        assert not [d for d in out if isinstance(d, Reject) and d.request_id == "victim"], out
        spawn = next((d for d in out if isinstance(d, Spawn)), None)
        assert spawn is not None, f"nothing spawned at {now}: {s.queue()}"
        running = spawn.model
        grants = s.child_ready(running, now=now)
        flying[running].update(d.request_id for d in grants if isinstance(d, Grant))
        if running == "v":
            served_at = now
            break
    assert served_at is not None, "v was never served: starved"
    bound = urgent_after(max_wait) + 5 * len(COMPETITORS) + 5
    assert served_at - since <= bound, (served_at - since, bound)
    if max_wait is not None:
        assert served_at - since < max_wait
