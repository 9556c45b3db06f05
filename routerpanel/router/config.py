"""Frozen configuration the engine runs on: one ``PresetSpec`` per model and one ``RouterConfig``.

The adapters build these from the database (or an INI file); the engine never reads either. All
validation happens here, in ``__post_init__``, so a bad value fails where it is made with a message
that names the field, instead of deep inside the scheduler.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

# Seconds a child gets between the exit request and SIGKILL when nothing sets its own (llama.cpp's
# router: 10, ROUTER_SPEC 2.12). The one spelling: presets, settings, the supervisor and the API
# take it from here.
DEFAULT_STOP_TIMEOUT = 10
DEFAULT_LEASE_TTL = 30.0  # seconds a lease lives unrenewed (team mode; in process it never ends)

# The supervisor appends these (S2); a preset that carries them would fight it.
_RESERVED_FLAGS = ("--host", "--port")
# What ``runrouter --node NAME`` and a preset's ``node`` key accept as a node name (issue 18).
NODE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def node_names_problem(names: Iterable[str]) -> str | None:
    """Say what is wrong with a list of node names (a bad or repeated name), or None."""
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
            return f"node name {name!r} may only use letters, digits, '.', '_' and '-'"
        if name in seen:
            return f"node {name!r} is named twice"
        seen.add(name)
    return None


def _positive(
    owner: str,
    field: str,
    value: float | None,
    *,
    allow_none: bool = False,
    allow_zero: bool = False,
) -> None:
    if value is None and allow_none:
        return
    ok = value is not None and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value is None or value < 0 or (value == 0 and not allow_zero):
        what = "a number of seconds >= 0" if allow_zero else "a positive number of seconds"
        raise ValueError(f"{owner}: {field} must be {what}, got {value!r}")


def _check_int(owner: str, field: str, value: object, *, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}: {field} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {field} must be >= {minimum}, got {value}")


@dataclass(frozen=True, kw_only=True)
class PresetSpec:
    """Define one model as the engine runs it.

    ``argv`` is the rendered command (binary first) without ``--host``/``--port``: the supervisor
    appends those. ``command`` (argv, env, protocol) is what A14 compares on reload: any other
    field changes without a restart. ``ttl`` is ignored while ``pinned`` (a pin means "keep it").
    ``memory_estimate`` is in bytes; an unknown estimate counts as 0 against the memory budget.
    ``hang_timeout`` turns on the watchdog: a busy child that sends no byte for that long is
    probed and killed if it made no progress. ``speaks_child_protocol`` is True for llama-server
    (state lines on stdout, S3); other server binaries are polled on ``/health``.
    """

    name: str
    argv: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    stop_timeout: float = float(DEFAULT_STOP_TIMEOUT)
    load_timeout: float | None = None
    hang_timeout: float | None = None  # None: no watchdog for this model
    ttl: float | None = None
    pinned: bool = False
    load_on_startup: bool = False
    memory_estimate: int | None = None
    speaks_child_protocol: bool = True
    nodes: tuple[str, ...] = ()
    problem: str | None = None  # why it cannot start, as the adapter found (preflight.py)
    files: tuple[tuple[str, str], ...] = ()  # (option key, path) of the files it reads at start

    def __post_init__(self) -> None:
        owner = f"preset {self.name!r}"
        if not isinstance(self.name, str) or not self.name or self.name != self.name.strip():
            raise ValueError(f"{owner}: name must be a non-empty string without outer spaces")
        self._check_argv(owner)
        self._check_aliases(owner)
        self._check_env(owner)
        _positive(owner, "stop_timeout", self.stop_timeout, allow_zero=True)  # 0: kill at once
        _positive(owner, "load_timeout", self.load_timeout, allow_none=True)
        _positive(owner, "hang_timeout", self.hang_timeout, allow_none=True)
        _positive(owner, "ttl", self.ttl, allow_none=True)
        if self.memory_estimate is not None:
            _check_int(owner, "memory_estimate", self.memory_estimate, minimum=0)
        if not isinstance(self.nodes, tuple):
            raise ValueError(f"{owner}: nodes must be a tuple of node names")
        problem = node_names_problem(self.nodes)
        if problem:
            raise ValueError(f"{owner}: {problem}")

    def _check_argv(self, owner: str) -> None:
        if not isinstance(self.argv, tuple) or not self.argv:
            raise ValueError(f"{owner}: argv must be a non-empty tuple (binary first)")
        if not all(isinstance(arg, str) for arg in self.argv) or not self.argv[0]:
            raise ValueError(f"{owner}: argv must hold strings and start with the binary")
        for arg in self.argv[1:]:
            if arg.split("=", 1)[0] in _RESERVED_FLAGS:
                raise ValueError(f"{owner}: argv must not contain {arg!r}; the supervisor sets it")

    def _check_aliases(self, owner: str) -> None:
        if not isinstance(self.aliases, tuple) or not all(
            isinstance(a, str) and a for a in self.aliases
        ):
            raise ValueError(f"{owner}: aliases must be a tuple of non-empty strings")
        if self.name in self.aliases or len(set(self.aliases)) != len(self.aliases):
            raise ValueError(f"{owner}: aliases must be distinct and differ from the name")

    def _check_env(self, owner: str) -> None:
        if not isinstance(self.env, tuple) or not all(
            isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)
            for pair in self.env
        ):
            raise ValueError(f"{owner}: env must be a tuple of (name, value) string pairs")
        keys = [key for key, _ in self.env]
        if any(not key or "=" in key for key in keys) or len(set(keys)) != len(keys):
            raise ValueError(f"{owner}: env names must be distinct, non-empty and contain no '='")

    @property
    def command(self) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], bool]:
        """Return what a running child was started with; a change restarts it on reload (A14)."""
        return (self.argv, self.env, self.speaks_child_protocol)


class QueuePolicy(StrEnum):
    """The order queue entries are served in: arrival (llama.cpp's) or fair share (issue 17.5)."""

    FIFO = "fifo"
    FAIR = "fair"


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """Define the router-wide limits (RouterSettings, DESIGN §6).

    ``models_max <= 0`` means unlimited. ``memory_budget`` (bytes) turns on memory mode: the
    estimates of running models plus the new one must fit, and after any child exits the settle
    gate holds spawns until a memory sample shows the next model's estimate plus
    ``memory_headroom`` available, or ``settle_timeout`` passes. ``max_waiters`` limits the
    waiters of ONE model's queue entry, not the whole queue: a flood of requests for one model
    must not deny the others, and entries are bounded by the number of presets anyway.
    ``max_wait`` bounds how long a waiter may wait (A8). ``quarantine_after`` consecutive failed
    loads quarantine a model; 0 never does. ``default_stop_timeout`` is what adapters put into a
    ``PresetSpec`` whose preset sets none; ``lease_ttl`` is for the engine's leases (DESIGN §5).
    ``child_host`` is the address children listen on (and callers reach them at); with
    ``child_keys`` each child gets a random per-spawn API key (issue 18).
    """

    models_max: int = 4
    memory_budget: int | None = None
    memory_headroom: int = 0
    settle_timeout: float = 5.0
    max_waiters: int | None = None
    max_wait: float | None = None
    quarantine_after: int = 3
    default_stop_timeout: float = float(DEFAULT_STOP_TIMEOUT)
    lease_ttl: float = DEFAULT_LEASE_TTL
    queue_policy: QueuePolicy = QueuePolicy.FIFO
    child_host: str = "127.0.0.1"
    child_keys: bool = False

    def __post_init__(self) -> None:
        owner = "router settings"
        if not isinstance(self.child_host, str) or not self.child_host.strip("[] "):
            raise ValueError(f"{owner}: child_host must be an address, got {self.child_host!r}")
        if not isinstance(self.child_keys, bool):
            raise ValueError(f"{owner}: child_keys must be true or false, got {self.child_keys!r}")
        try:
            object.__setattr__(self, "queue_policy", QueuePolicy(self.queue_policy))
        except ValueError:
            raise ValueError(
                f"{owner}: queue_policy must be fifo or fair, got {self.queue_policy!r}"
            ) from None
        _check_int(owner, "models_max", self.models_max, minimum=None)
        if self.memory_budget is not None:
            _check_int(owner, "memory_budget", self.memory_budget, minimum=1)
        _check_int(owner, "memory_headroom", self.memory_headroom, minimum=0)
        _positive(owner, "settle_timeout", self.settle_timeout, allow_zero=True)
        if self.max_waiters is not None:
            _check_int(owner, "max_waiters", self.max_waiters, minimum=1)
        _positive(owner, "max_wait", self.max_wait, allow_none=True)
        _check_int(owner, "quarantine_after", self.quarantine_after, minimum=0)
        _positive(owner, "default_stop_timeout", self.default_stop_timeout, allow_zero=True)
        _positive(owner, "lease_ttl", self.lease_ttl)

    @property
    def unlimited(self) -> bool:
        """Return whether ``models_max`` puts no cap on running models."""
        return self.models_max <= 0


class StartupError(ValueError):
    """The router must refuse to start (A13)."""


def preset_map(presets: Iterable[PresetSpec]) -> dict[str, PresetSpec]:
    """Index presets by name; raise ValueError on a duplicate name or a colliding alias."""
    by_name: dict[str, PresetSpec] = {}
    for spec in presets:
        if spec.name in by_name:
            raise ValueError(f"preset {spec.name!r} is defined twice")
        by_name[spec.name] = spec
    owner: dict[str, str] = {}
    for spec in by_name.values():
        for alias in spec.aliases:
            clash = alias if alias in by_name else owner.get(alias)
            if clash is not None:
                raise ValueError(f"alias {alias!r} of preset {spec.name!r} collides with {clash!r}")
            owner[alias] = spec.name
    return by_name


def startup_loads(presets: Iterable[PresetSpec], config: RouterConfig) -> tuple[str, ...]:
    """Return the load-on-startup models in name order, or refuse to start (A13).

    llama.cpp refuses even when ``models_max <= 0`` (ROUTER_SPEC §15.3); unlimited means
    unlimited here. The caller submits each name as a ``load`` request through the queue (A9).
    """
    names = tuple(
        sorted(spec.name for spec in preset_map(presets).values() if spec.load_on_startup)
    )
    if not config.unlimited and len(names) > config.models_max:
        raise StartupError(
            f"number of models to load on startup ({len(names)}) exceeds models_max "
            f"({config.models_max})"
        )
    return names
