"""What goes into the engine's inbox, who posts it, and what comes back to callers.

Every public engine method turns into one of these commands; the supervisor's events go into the
same inbox unchanged; ``Timer`` posts ``Tick`` at deadlines and ``sample_memory`` posts
``MemorySampled``. Commands that answer carry an ``asyncio.Future`` the engine resolves; a future
that is already done (its caller went away) is skipped, never resolved twice. ``Callers`` is the
engine's book of waiting requests and granted leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import Grant, Reject, RequestKind
from routerpanel.router.memory import ChildMemory, SystemMemory, children_memory, system_memory
from routerpanel.router.supervisor import SupervisorEvent
from routerpanel.router.watchdog import Reading


class RouterError(Exception):
    """A request the router answers with an error; ``body()`` is llama.cpp's error shape.

    ``details`` holds the child's last log lines for a failed load (A10); ``body()`` leaves them
    out so the shape stays llama.cpp's, and the HTTP layer may show them.
    """

    status: int
    error_type: str
    message: str
    retry_after: float | None  # seconds, for a Retry-After header (A8)
    details: tuple[str, ...]

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        retry_after: float | None = None,
        details: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.retry_after = retry_after
        self.details = details

    @classmethod
    def from_reject(cls, d: Reject) -> RouterError:
        return cls(d.status, d.error_type, d.message, retry_after=d.retry_after, details=d.details)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "type": self.error_type}}

    def __repr__(self) -> str:
        return f"RouterError({self.status}, {self.error_type!r}, {self.message!r})"


def unavailable(message: str) -> RouterError:
    return RouterError(503, "unavailable_error", message)


@dataclass(frozen=True)
class Lease:
    """A granted request: send it to ``port``; it counts as in flight until released."""

    lease_id: str
    request_id: str
    model: str
    port: int
    expires_at: float  # engine clock time; renew() pushes it, the caller's copy is not updated
    actor: str = ""  # who asked (the audit's actor if the lease expires)


# ---- commands -----------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Leave:
    """The request's client went away (A7); a granted one is released."""

    request_id: str


@dataclass(frozen=True)
class Release:
    lease_id: str


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

    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Quit:
    """Stop the inbox loop (last command of shutdown)."""


Command = (
    Acquire
    | Leave
    | Release
    | Unload
    | CancelQueued
    | Reload
    | UpdateSettings
    | Shutdown
    | Tick
    | MemorySampled
    | ProbeDone
    | Note
    | Quit
    | SupervisorEvent
)


# ---- who posts besides callers -----------------------------------------------------------


class Timer:
    """Post one ``Tick`` when the earliest deadline passes: sleep until then, never poll.

    The engine calls ``arm`` after every command with the earliest of the scheduler's
    ``next_deadline()`` and the lease expiries (STYLE 4: deadlines are data).
    """

    def __init__(self, clock: Callable[[], float], post: Callable[[Tick], None]) -> None:
        self.deadline: float | None = None
        self._clock, self._post = clock, post
        self._wake = asyncio.Event()

    def arm(self, deadline: float | None) -> None:
        if deadline != self.deadline:  # an unchanged deadline must not post another tick
            self.deadline = deadline
            self._wake.set()

    def nudge(self) -> None:
        """Look at the clock again (it jumped: a fake clock in tests, a suspended machine)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.deadline
            if deadline is not None and deadline <= self._clock():
                self._post(Tick())
                await self._wake.wait()  # handling the tick re-arms the timer
                continue
            delay = None if deadline is None else deadline - self._clock()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()


async def sample_memory(
    interval: float,
    pids: Callable[[], dict[str, int]],
    post: Callable[[MemorySampled], None],
    soon: asyncio.Event,
) -> None:
    """Post a memory sample every ``interval`` seconds, or at once when ``soon`` is set (S9).

    Reading /proc blocks for a few milliseconds, so it runs in a thread, off the engine's loop.
    """
    while True:
        post(await asyncio.to_thread(_measure, pids()))
        soon.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await soon.wait()


def _measure(pids: dict[str, int]) -> MemorySampled:
    return MemorySampled(system_memory(), children_memory(pids))


# ---- the callers' book --------------------------------------------------------------------


def resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


@dataclass(eq=False)
class _LeaseRecord:
    lease: Lease
    expires_at: float  # moves on renew(); the caller's copy does not (inf: never expires)


@dataclass(eq=False)
class _ModelLeases:
    """A model's leases in flight and the last byte sent on any of them (the watchdog's input)."""

    count: int
    last_progress: float
    instance: int  # the child's port at grant time: a new child is a new watch


REVOKED_KEPT = 10_000  # revoked leases remembered for their callers' "why?" (oldest dropped)


class Callers:
    """Track requests waiting for an answer and the leases granted to them.

    Owned by the engine's loop. A lease is a granted proxy request: the scheduler counts it in
    flight until ``release``, ``leave`` or expiry returns its request id to be finished.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, Acquire] = {}
        self._leases: dict[str, _LeaseRecord] = {}
        self._by_request: dict[str, str] = {}  # request id -> lease id
        self._models: dict[str, _ModelLeases] = {}
        self._revoked: dict[str, RouterError] = {}  # lease id -> why it was ended (insertion order)
        self._expiries: list[tuple[float, str]] = []  # heap; stale entries are skipped lazily

    def busy(self, request_id: str) -> bool:
        return request_id in self._waiters or request_id in self._by_request

    def renewable(self, request_id: str) -> bool:
        waiter = self._waiters.get(request_id)
        return waiter is None or waiter.renewable

    def wait(self, command: Acquire) -> None:
        self._waiters[command.request_id] = command

    def grant(self, grant: Grant, port: int, expires_at: float, now: float) -> bool:
        """Answer the waiter; False when a proxy grant found nobody to take it (release it).

        ``expires_at`` is ``math.inf`` for a caller in this process, which never renews.
        """
        waiter = self._waiters.pop(grant.request_id, None)
        if waiter is None or grant.kind is RequestKind.LOAD:
            if waiter is not None:
                resolve(waiter.future, None)
            return True
        if waiter.future.done():  # cancelled between its arrival and this grant (A7)
            return False
        lease_id = uuid.uuid4().hex
        lease = Lease(lease_id, grant.request_id, grant.model, port, expires_at, waiter.actor)
        self._leases[lease.lease_id] = _LeaseRecord(lease, expires_at)
        self._by_request[lease.request_id] = lease.lease_id
        if expires_at != math.inf:
            heapq.heappush(self._expiries, (expires_at, lease_id))
        busy = self._models.get(grant.model)
        if busy is None or busy.instance != port:
            self._models[grant.model] = _ModelLeases(1, now, port)
        else:
            busy.count += 1
        waiter.future.set_result(lease)
        return True

    def reject(self, request_id: str, error: RouterError) -> None:
        if (waiter := self._waiters.pop(request_id, None)) is not None:
            fail(waiter.future, error)

    def leave(self, request_id: str) -> None:
        """Forget a request whose client left: its acquire raises 499, its lease ends."""
        self.reject(request_id, RouterError(499, "cancelled", "the request was cancelled"))
        if (lease_id := self._by_request.get(request_id)) is not None:
            self.release(lease_id)

    def release(self, lease_id: str) -> str | None:
        """End a lease; return its request id, or None if it had already ended."""
        self._revoked.pop(lease_id, None)
        record = self._leases.pop(lease_id, None)
        if record is None:
            return None
        del self._by_request[record.lease.request_id]
        busy = self._models.get(record.lease.model)
        if busy is not None and busy.instance == record.lease.port:
            busy.count -= 1
            if busy.count <= 0:
                del self._models[record.lease.model]
        return record.lease.request_id

    def renew(self, lease_id: str, expires_at: float) -> bool:
        record = self._leases.get(lease_id)
        if record is not None and expires_at > record.expires_at:
            record.expires_at = expires_at
            heapq.heappush(self._expiries, (expires_at, lease_id))
        return record is not None

    def progress(self, lease_id: str, at: float) -> None:
        """A byte went out on this lease at ``at`` (engine clock): the child is not hung."""
        record = self._leases.get(lease_id)
        if record is None:
            return
        busy = self._models.get(record.lease.model)
        if busy is not None and busy.instance == record.lease.port and at > busy.last_progress:
            busy.last_progress = at

    def in_flight(self) -> dict[str, tuple[int, float, int]]:
        """Return model -> (leases, last progress, child instance) for models with leases."""
        return {m: (b.count, b.last_progress, b.instance) for m, b in self._models.items()}

    def revoke(self, model: str, error: RouterError) -> list[str]:
        """End every lease of ``model`` and remember why, for callers that ask (the watchdog's
        kill). Returns the request ids, to be finished in the scheduler."""
        ended = [r.lease for r in self._leases.values() if r.lease.model == model]
        for lease in ended:
            self.release(lease.lease_id)
            self._revoked[lease.lease_id] = error
        while len(self._revoked) > REVOKED_KEPT:
            del self._revoked[next(iter(self._revoked))]
        return [lease.request_id for lease in ended]

    def lease_for(self, request_id: str) -> Lease | None:
        """The lease granted to this request, if it still runs."""
        lease_id = self._by_request.get(request_id)
        record = self._leases.get(lease_id) if lease_id is not None else None
        return None if record is None else record.lease

    def why_ended(self, lease_id: str) -> RouterError | None:
        """Return why the router ended this lease (it was revoked), or None."""
        return self._revoked.get(lease_id)

    def expired(self, now: float) -> list[Lease]:
        """End and return the leases not renewed in time (DESIGN §5)."""
        gone: list[Lease] = []
        while self._expiries and self._expiries[0][0] <= now:
            at, lease_id = heapq.heappop(self._expiries)
            record = self._leases.get(lease_id)
            if record is not None and record.expires_at == at:  # else renewed or ended
                self.release(lease_id)
                gone.append(record.lease)
        return gone

    def holders(self) -> dict[str, dict[str, int]]:
        """Return who holds each model's leases now: model -> actor -> requests in flight."""
        out: dict[str, dict[str, int]] = {}
        for record in self._leases.values():
            by = out.setdefault(record.lease.model, {})
            by[record.lease.actor] = by.get(record.lease.actor, 0) + 1
        return out

    def next_expiry(self) -> float | None:
        while self._expiries:
            at, lease_id = self._expiries[0]
            record = self._leases.get(lease_id)
            if record is not None and record.expires_at == at:
                return at
            heapq.heappop(self._expiries)  # stale: renewed since, or ended
        return None

    def close(self, error: RouterError) -> None:
        """Fail every waiter and forget every lease (shutdown)."""
        for request_id in list(self._waiters):
            self.reject(request_id, error)
        self._leases.clear()
        self._by_request.clear()
        self._models.clear()
        self._expiries.clear()
