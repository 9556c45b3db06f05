"""Who a stop or a failed load is put down to: the limit lowered before a shrink's evictions, and
the models evicted to make room for a load that then failed.

Fed by the mapper from the events it reads (model.state, settings.changed, model.evicted,
model.exited); it makes no rows, it only says who and why. Owned by the router's loop.
"""

from __future__ import annotations

from typing import Any

from models_app.panel.views.common import human_bytes
from routerpanel.router import states
from routerpanel.router.decisions import StopReason


class Attribution:
    """What the mapper remembers between events to name the cause of an eviction or its cost."""

    def __init__(self) -> None:
        self._running: set[str] = set()  # models whose child runs (model.state events)
        # who lowered which limit, for the evictions that follow (issue 49.6)
        self._lowered: tuple[str, str] = ("scheduler", "models_max or the memory budget")
        # model -> the models evicted to make room for its load, until it is ready or fails: a
        # load that fails after evicting names what it cost.
        self._evicted_for: dict[str, list[str]] = {}

    def state(self, model: str, to: str) -> None:
        """A ``model.state`` event: ``model`` now is in state ``to``."""
        if to in states.RUNNING:
            self._running.add(model)
        else:
            self._running.discard(model)

    def limits_changed(self, d: dict[str, Any]) -> None:
        """Remember who changed the limits and which one now holds fewer models than run: the
        evictions that follow (``shrink``) name both."""
        config = d.get("config") or {}
        models_max, budget = config.get("models_max") or 0, config.get("memory_budget")
        if 0 < models_max < len(self._running):
            what = f"Max running models to {models_max}"
        elif budget is not None:
            what = f"the memory budget to {human_bytes(budget)}"
        else:
            what = "models_max or the memory budget"
        self._lowered = (d.get("actor") or "scheduler", what)

    def eviction(
        self, victim: str, reason: StopReason, trigger: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """Why ``victim`` was evicted, and the trigger its row names (a shrink's: who lowered
        the limit). An eviction for a load is remembered against that load."""
        if reason is StopReason.SHRINK:
            actor, what = self._lowered
            return f"over the limit after {actor} lowered {what}", {**trigger, "actor": actor}
        if trigger.get("model"):
            self._evicted_for.setdefault(trigger["model"], []).append(victim)
        return f"least recently used idle model, stopped for {trigger.get('model')}", trigger

    def ready(self, model: str) -> None:
        """``model``'s load succeeded: what was evicted for it is no longer a cost to name."""
        self._evicted_for.pop(model, None)

    def load_failed(self, model: str) -> list[str]:
        """The models evicted for ``model``'s load, which failed (forgotten once asked)."""
        return self._evicted_for.pop(model, [])
