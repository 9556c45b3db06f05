"""Fair share: the scheduler's decision time under ``fair`` against ``fifo``, 10,000 waiters.

    .venv/bin/python bench/fair_share.py [--waiters 10000] [--models 48] [--owners 40]
                                         [--samples 300]

Two schedulers (``routerpanel.router.scheduler.Scheduler``, fake clock) are built alike, one
with ``queue_policy = fifo`` and one with ``fair``: ``models_max = 4``, four models loaded and
busy with one request each (nothing can be evicted), and the waiters spread over the other
models' entries and over ``--owners`` owners (personal keys ``key:u<k>/k``, a third of them
``low``, a tenth ``high``, the rest ``normal``). Before timing, every owner gets a different
recent use (requests held for 1-40 s), so the fair order has real keys to sort.

Timed, one call each with ``time.perf_counter_ns``, the two policies interleaved sample by
sample (the same input to both, in alternating order) so that a slow phase of the machine hits
both alike:

* join — a waiter joins a queued model's entry (A2);
* leave — that waiter leaves (A7);
* grant — a request for a loaded, busy model, granted at once (A1);
* finish — that request ends (the model stays busy);
* swap — the last request on a loaded model ends (Stop, A5), its child exits (the head entry
  spawns, A6: the one decision whose outcome the policy changes), the new child is ready (its
  waiters are granted). The queue is refilled to the same size between swaps (not timed).

Prints one Markdown table: median and p95 per input and policy, and fair / fifo of the medians
and of the mean over all inputs. The issue's target: fair within 1.2× of fifo.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import Grant, Spawn, Stop
from routerpanel.router.scheduler import Scheduler

MODELS_MAX = 4
POLICIES = ("fifo", "fair")
KINDS = ("join", "leave", "grant", "finish", "swap")


def specs(n: int) -> list[PresetSpec]:
    return [PresetSpec(name=f"m{i:03d}", argv=("llama-server", "-m", f"m{i:03d}.gguf"))
            for i in range(n)]  # fmt: skip


def actor(k: int, owners: int) -> tuple[str, str]:
    """The k-th request's actor and priority: owners round-robin, fixed classes per owner."""
    o = k % owners
    priority = "high" if o % 10 == 0 else "low" if o % 3 == 0 else "normal"
    return f"key:u{o}/k", priority


class World:
    """One scheduler and its fake clock; every input goes through ``call``."""

    def __init__(self, policy: str, models: int, waiters: int, owners: int) -> None:
        self.now = 0.0
        self.models, self.owners, self.waiters = models, owners, waiters
        config = RouterConfig(models_max=MODELS_MAX, queue_policy=policy)
        self.s = Scheduler(specs(models), config)
        self.busy: dict[str, str] = {}
        for i in range(MODELS_MAX):
            name = f"m{i:03d}"
            self.s.request_arrived(f"busy-{name}", name, now=self.tick())
            self.s.child_ready(name, now=self.tick())
            self.busy[name] = f"busy-{name}"
        for o in range(owners):  # recent use: owner o held a model for 1 + o % 40 seconds
            who, priority = actor(o, owners)
            self.s.request_arrived(f"use-{o}", "m000", now=self.now, actor=who, priority=priority)
            self.s.request_finished(f"use-{o}", now=self.now + 1 + o % 40)
        self.now += 41
        self.fresh = 0
        self.refill()

    def tick(self) -> float:
        self.now += 0.001
        return self.now

    def queued_name(self, k: int) -> str:
        return f"m{MODELS_MAX + k % (self.models - MODELS_MAX):03d}"

    def arrive(self, rid: str, k: int, model: str) -> list[Any]:
        who, priority = actor(k, self.owners)
        return self.s.request_arrived(rid, model, now=self.tick(), actor=who, priority=priority)

    def refill(self) -> None:
        for _ in range(self.waiters - sum(e.waiters for e in self.s.queue())):
            self.fresh += 1
            names = (self.queued_name(self.fresh + j) for j in range(self.models))
            name = next(n for n in names if n not in self.busy)
            self.arrive(f"r{self.fresh}", self.fresh, name)


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter_ns()
    out = call()
    return (time.perf_counter_ns() - started) / 1e9, out


def sample(w: World, i: int) -> dict[str, float]:
    """One sample of every input kind on world ``w``."""
    s, out = w.s, {}
    model = w.queued_name(i)
    while model in w.busy:
        i += 1
        model = w.queued_name(i)
    out["join"] = timed(lambda: w.arrive(f"x{i}", i, model))[0]
    out["leave"] = timed(lambda: s.waiter_left(f"x{i}", now=w.tick()))[0]
    loaded = min(w.busy)
    t, d = timed(lambda: w.arrive(f"g{i}", i, loaded))
    assert any(isinstance(x, Grant) for x in d)
    out["grant"] = t
    out["finish"] = timed(lambda: s.request_finished(f"g{i}", now=w.tick()))[0]
    victim = min(w.busy)
    t1, d1 = timed(lambda: s.request_finished(w.busy.pop(victim), now=w.tick()))
    assert any(isinstance(x, Stop) and x.model == victim for x in d1), d1
    t2, d2 = timed(lambda: s.child_exited(victim, now=w.tick(), exit_code=0))
    spawned = next(x.model for x in d2 if isinstance(x, Spawn))
    t3, d3 = timed(lambda: s.child_ready(spawned, now=w.tick()))
    granted = [x.request_id for x in d3 if isinstance(x, Grant)]
    out["swap"] = t1 + t2 + t3
    w.busy[spawned] = granted[0]
    for rid in granted[1:]:  # untimed: back to one busy request per loaded model
        s.request_finished(rid, now=w.tick())
    w.refill()
    return out


def run(waiters: int, models: int, owners: int, samples: int) -> dict[str, dict[str, list[float]]]:
    worlds = {p: World(p, models, waiters, owners) for p in POLICIES}
    for w in worlds.values():
        assert sum(e.waiters for e in w.s.queue()) == waiters
    costs: dict[str, dict[str, list[float]]] = {p: {k: [] for k in KINDS} for p in POLICIES}
    gc.collect()
    gc.disable()  # a collection inside one timed call would land on one policy only
    try:
        for i in range(samples):
            order = POLICIES if i % 2 == 0 else POLICIES[::-1]
            for p in order:
                for kind, t in sample(worlds[p], i).items():
                    costs[p][kind].append(t)
            if i % 50 == 49:
                gc.enable()
                gc.collect()
                gc.disable()
    finally:
        gc.enable()
    return costs


def report(costs: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> str:
    def ms(x: float) -> str:
        return f"{x * 1000:.3f}"

    lines = [
        f"### Fair share: decision time at {args.waiters:,} waiters over {args.models} presets and "
        f"{args.owners} owners (models_max {MODELS_MAX}, {args.samples} samples per input)",
        "",
        "| input | fifo median ms | fifo p95 ms | fair median ms | fair p95 ms | fair / fifo |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        fifo, fair = costs["fifo"][kind], costs["fair"][kind]
        med = [statistics.median(fifo), statistics.median(fair)]
        p95 = [statistics.quantiles(fifo, n=20)[-1], statistics.quantiles(fair, n=20)[-1]]
        row = f"| {kind} | {ms(med[0])} | {ms(p95[0])} | {ms(med[1])} | {ms(p95[1])} |"
        lines.append(f"{row} {med[1] / med[0]:.2f} |")
    mean = {p: statistics.fmean(t for k in KINDS for t in costs[p][k]) for p in POLICIES}
    lines.append(
        f"| all inputs (mean) | {ms(mean['fifo'])} | | {ms(mean['fair'])} | | "
        f"{mean['fair'] / mean['fifo']:.2f} |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--models", type=int, default=48)
    parser.add_argument("--owners", type=int, default=40)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    print(report(run(args.waiters, args.models, args.owners, args.samples), args))


if __name__ == "__main__":
    main()
