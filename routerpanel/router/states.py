"""Model states, their named groups and the one transition table (DESIGN §4, STYLE 1-2).

``stopping`` is a *flag*, not a state. llama.cpp keeps a stopping instance's status
(``loaded``, ``sleeping`` or ``loading``) until its exit is reaped (ROUTER_SPEC §3.2), and clients
read that status; a ``stopping`` state would lose which of the three it was, and every "running"
test would have to remember to include it. So the scheduler records ``(state, stopping)``: the
flag is set when it decides Stop/Kill (or the supervisor reports the child stuck), stays set while
the child is alive, and clears only when the exit is observed. ``stuck`` always has it set.
"""

# A leaf module: stdlib only, so the scheduler, supervisor and adapters share one vocabulary
# without importing each other (STYLE 1).
from __future__ import annotations

from enum import StrEnum
from typing import Literal


class ModelState(StrEnum):
    """The engine's state of one model; ``api_status`` maps it to llama.cpp's four values."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    SLEEPING = "sleeping"
    FAILED = "failed"  # unloaded after an unexpected exit; the next request retries
    QUARANTINED = "quarantined"  # N consecutive failed loads; fail fast until edited or retried
    STUCK = "stuck"  # SIGKILLed but not reaped: still holds its slot (S6)


UNLOADED = ModelState.UNLOADED
LOADING = ModelState.LOADING
LOADED = ModelState.LOADED
SLEEPING = ModelState.SLEEPING
FAILED = ModelState.FAILED
QUARANTINED = ModelState.QUARANTINED
STUCK = ModelState.STUCK

ApiStatus = Literal["unloaded", "loading", "loaded", "sleeping"]

# Counted toward models_max: a child exists until its exit is observed (A3, A6). Stopping models
# are in here too, because stopping is a flag on these states.
RUNNING: frozenset[ModelState] = frozenset({LOADING, LOADED, SLEEPING, STUCK})
# Granted at once when not stopping (A1); a sleeping child wakes on the request (A12).
SERVABLE: frozenset[ModelState] = frozenset({LOADED, SLEEPING})
# May be chosen as an LRU victim (A5, A12); a loading model never is (ROUTER_SPEC 7.4).
EVICTABLE: frozenset[ModelState] = frozenset({LOADED, SLEEPING})
# May be told to stop; LOADING is killed at once instead of asked (S4).
STOPPABLE: frozenset[ModelState] = frozenset({LOADING, LOADED, SLEEPING})
# No child: the queue may spawn one. QUARANTINED is down but needs an edit or explicit load.
SPAWNABLE: frozenset[ModelState] = frozenset({UNLOADED, FAILED})
DOWN: frozenset[ModelState] = frozenset({UNLOADED, FAILED, QUARANTINED})
# Reported as llama.cpp's ``"failed": true`` (a force-kill reports failed there too, §3.5).
FAILED_STATES: frozenset[ModelState] = frozenset({FAILED, QUARANTINED, STUCK})


def browser_sets() -> dict[str, list[str]]:
    """The state sets the panel's scripts use, rendered into every page (one source of truth)."""
    sets = {"RUNNING": RUNNING, "STOPPABLE": STOPPABLE, "DOWN": DOWN, "SERVABLE": SERVABLE}
    return {name: sorted(str(state) for state in states) for name, states in sets.items()}


ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    UNLOADED: frozenset({LOADING}),
    FAILED: frozenset({LOADING, UNLOADED}),
    QUARANTINED: frozenset({UNLOADED}),
    LOADING: frozenset({LOADED, UNLOADED, FAILED, QUARANTINED, STUCK}),
    LOADED: frozenset({SLEEPING, UNLOADED, FAILED, STUCK}),
    SLEEPING: frozenset({LOADING, LOADED, UNLOADED, FAILED, STUCK}),
    STUCK: frozenset({UNLOADED, FAILED}),
}

_API: dict[ModelState, ApiStatus] = {
    UNLOADED: "unloaded",
    LOADING: "loading",
    LOADED: "loaded",
    SLEEPING: "sleeping",
    FAILED: "unloaded",
    QUARANTINED: "unloaded",
    # A stuck child cannot serve and will not: report what a force-kill reports in llama.cpp.
    STUCK: "unloaded",
}


class IllegalTransitionError(ValueError):
    """An edge that ``ALLOWED`` does not list: a bug in the caller, never a runtime condition."""


def api_status(state: ModelState) -> ApiStatus:
    """Return llama.cpp's status for ``state``; the stopping flag never changes it."""
    return _API[state]


def api_failed(state: ModelState) -> bool:
    """Return llama.cpp's ``failed`` flag for ``state``."""
    return state in FAILED_STATES


def check_transition(frm: ModelState, to: ModelState, *, stopping: bool) -> None:
    """Raise unless ``frm -> to`` (with the given stopping flag) is legal; staying put is."""
    if frm != to and to not in ALLOWED[frm]:
        raise IllegalTransitionError(f"illegal model state transition {frm} -> {to}")
    if stopping and to not in RUNNING:
        raise IllegalTransitionError(f"state {to} has no child, so it cannot be stopping")
    if to is STUCK and not stopping:
        raise IllegalTransitionError("a stuck model is always stopping (its exit is pending)")
