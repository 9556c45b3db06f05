"""When a request can never get a slot while nothing changes (issue 44.2, A8b).

A request for a model that is not running waits for a slot. If every one of the ``models_max``
slots is held by a model that nothing but an operator will stop — a pinned or reserved model, or
a stuck one (S6) — and the model asked for is not one of them, the wait has no end: no release,
exit or eviction can free a slot. Such a request is answered at once, 503 with this reason,
unless it asked to wait (``X-RouterPanel-Wait: 1``): then it waits, bounded by max wait (A8).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

WAIT_HEADER = "x-routerpanel-wait"


class Holder(NamedTuple):
    """A running model: ``kept`` says why only an operator can free its slot ("pinned",
    "reserved", "stuck"), or "" when it can be evicted or is stopping already."""

    name: str
    kept: str


def blocked_reason(model: str, running: Iterable[Holder], models_max: int) -> str | None:
    """Why ``model`` (not running) cannot start while nothing changes, or None when it can."""
    if models_max <= 0:
        return None  # unlimited
    holders = [h for h in running if h.name != model]
    if len(holders) < models_max or any(not h.kept for h in holders):
        return None  # a slot is free, or one will be: an idle model is evicted, a stop ends
    held = ", ".join(f"{h.name} is {h.kept}" for h in sorted(holders))
    return (
        f"model name={model} cannot start while nothing changes: all {models_max} slots are "
        f"held ({held}); unpin one or raise models_max, or send X-RouterPanel-Wait: 1 to wait"
    )
