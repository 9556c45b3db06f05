"""Scheduler test helpers: build a scheduler over fake presets, read its decisions by kind."""

from __future__ import annotations

from typing import TypeVar

from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import Decision, Grant, Kill, Reject, Spawn, Stop
from routerpanel.router.scheduler import Scheduler
from routerpanel.router.states import ModelState

D = TypeVar("D")


def preset(name: str, **kw: object) -> PresetSpec:
    return PresetSpec(name=name, argv=("llama-server", "-m", f"/models/{name}.gguf"), **kw)  # type: ignore[arg-type]


def sched(*models: str | PresetSpec, **config: object) -> Scheduler:
    specs = [m if isinstance(m, PresetSpec) else preset(m) for m in models]
    return Scheduler(specs, RouterConfig(**config))  # type: ignore[arg-type]


def of(kind: type[D], out: list[Decision]) -> list[D]:
    return [d for d in out if isinstance(d, kind)]


def spawned(out: list[Decision]) -> list[str]:
    return [d.model for d in of(Spawn, out)]


def stopped(out: list[Decision]) -> list[str]:
    return [d.model for d in of(Stop, out)] + [d.model for d in of(Kill, out)]


def granted(out: list[Decision]) -> list[str]:
    return [d.request_id for d in of(Grant, out)]


def rejected(out: list[Decision]) -> list[str]:
    return [d.request_id for d in of(Reject, out)]


def warm(s: Scheduler, name: str, *, now: float, busy: bool = False) -> str:
    """Bring ``name`` up through the queue (a slot must be free); leave it idle unless busy."""
    rid = f"warm-{name}-{now}"
    assert spawned(s.request_arrived(rid, name, now=now)) == [name]
    assert granted(s.child_ready(name, now=now)) == [rid]
    if not busy:
        s.request_finished(rid, now=now)
    return rid


def state(s: Scheduler, name: str) -> tuple[ModelState, bool]:
    view = s.model(name)
    return view.state, view.stopping
