"""What goes into the engine's inbox: one command per public engine method, and the facts the
engine's own helpers post (``Tick``, ``MemorySampled``, ``ProbeDone``, ``Note``).

The supervisor's reports go into the same inbox unchanged. Commands that answer carry an
``asyncio.Future`` the engine resolves; a future that is already done (its caller went away) is
skipped, never resolved twice (callers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from routerpanel.router.catalogue import Event
from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import RequestKind
from routerpanel.router.errors import Lease
from routerpanel.router.memory import ChildMemory, SystemMemory
from routerpanel.router.supervisor import SupervisorEvent
from routerpanel.router.watchdog import Reading


@dataclass(eq=False)
class Acquire:
    """A proxy request (answered with a Lease) or a load (answered with None), A2/A9."""

    request_id: str
    model: str
    actor: str
    kind: RequestKind
    autoload: bool
    future: asyncio.Future[Lease | None]
    renewable: bool = True  # False: a caller in this process, whose lease never expires
    priority: str = "normal"  # the key's priority class (queue_policy fair, issue 17.5)
    patient: bool = False  # wait even when no slot can free up (blocked.py)


@dataclass(frozen=True)
class Leave:
    """The request's client went away (A7); a granted one is released."""

    request_id: str


@dataclass(frozen=True)
class Release:
    lease_id: str


@dataclass(frozen=True)
class Drop:
    """The lease's holder is gone (its connection to the router closed): end it, audited like
    an expiry, without waiting for the lease TTL."""

    lease_id: str
    why: str


@dataclass(eq=False)
class Unload:
    model: str
    actor: str
    future: asyncio.Future[None]


@dataclass(eq=False)
class CancelQueued:
    """An operator rejects queued requests: one by id, or every waiter of one model's entry."""

    model: str | None
    request_id: str | None
    actor: str
    future: asyncio.Future[list[str]]


@dataclass(eq=False)
class Reload:
    presets: tuple[PresetSpec, ...]
    actor: str
    future: asyncio.Future[dict[str, list[str]]]


@dataclass(eq=False)
class UpdateSettings:
    config: RouterConfig
    actor: str
    future: asyncio.Future[None]


@dataclass(eq=False)
class SetReservations:
    """The models reserved now -> the owners (``user:<name>``) each is for; the whole set
    (issue 17.6). Answered with the models newly reserved, which the engine then loads."""

    reservations: Mapping[str, frozenset[str]]
    actor: str
    future: asyncio.Future[list[str]]


@dataclass(eq=False)
class Shutdown:
    actor: str
    future: asyncio.Future[None]


@dataclass(frozen=True)
class Tick:
    """A deadline passed (the timer's only message): max wait, ttl, settle, lease expiry."""


@dataclass(frozen=True)
class MemorySampled:
    system: SystemMemory
    children: tuple[ChildMemory, ...]


@dataclass(frozen=True)
class ProbeDone:
    """The watchdog's probe of a busy child came back (``reading`` None: no answer in time)."""

    model: str
    instance: int
    reading: Reading | None
    seconds: float  # how long the probe took


@dataclass(frozen=True)
class Note:
    """Publish an event the engine did not decide (an adapter's fact: a dropped message)."""

    type: Event
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Quit:
    """Stop the inbox loop (last command of shutdown)."""


Command = (
    Acquire
    | Leave
    | Release
    | Drop
    | Unload
    | CancelQueued
    | Reload
    | UpdateSettings
    | SetReservations
    | Shutdown
    | Tick
    | MemorySampled
    | ProbeDone
    | Note
    | Quit
    | SupervisorEvent
)
