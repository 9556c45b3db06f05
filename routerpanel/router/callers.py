"""The engine's book of callers: requests waiting for an answer, and the leases granted to them.

Owned by the engine's loop, no locks. A lease is a granted proxy request: the scheduler counts it
in flight until ``release``, ``leave``, expiry or ``revoke`` returns its request id to be
finished. Per model it keeps the last byte any lease reported (the hang watchdog's input), and
for leases the router ended it remembers why, for callers that ask.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import uuid
from dataclasses import dataclass
from typing import Any

from routerpanel.router.address import ChildAddress
from routerpanel.router.commands import Acquire
from routerpanel.router.decisions import Grant, RequestKind
from routerpanel.router.errors import Lease, RouterError
from routerpanel.router.receipts import Receipt, Receipts


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
        # Lease ids: unique to this book (a random prefix, so no other engine's) and cheap per
        # grant (a counter, not a uuid4 each).
        self._lease_prefix = uuid.uuid4().hex[:12]
        self._lease_numbers = itertools.count(1)
        self.receipts = Receipts()  # what each grant waited through (issue 17.3)

    def busy(self, request_id: str) -> bool:
        return request_id in self._waiters or request_id in self._by_request

    def renewable(self, request_id: str) -> bool:
        waiter = self._waiters.get(request_id)
        return waiter is None or waiter.renewable

    def wait(self, command: Acquire, now: float) -> None:
        self._waiters[command.request_id] = command
        self.receipts.arrived(command.request_id, now)

    def grant(self, grant: Grant, address: ChildAddress, expires_at: float, now: float) -> bool:
        """Answer the waiter; False when a proxy grant found nobody to take it (release it).

        ``expires_at`` is ``math.inf`` for a caller in this process, which never renews.
        """
        waiter = self._waiters.pop(grant.request_id, None)
        if waiter is None or grant.kind is RequestKind.LOAD:
            self.receipts.forget(grant.request_id)
            if waiter is not None:
                resolve(waiter.future, None)
            return True
        receipt = self.receipts.granted(grant.request_id, grant.model, now)
        if waiter.future.done():  # cancelled between its arrival and this grant (A7)
            return False
        lease = self._lease(grant.request_id, grant.model, waiter.actor, receipt, address,
                            expires_at, now)  # fmt: skip
        waiter.future.set_result(lease)
        return True

    def grant_at_once(
        self, request_id: str, model: str, actor: str, address: ChildAddress, now: float
    ) -> Lease:
        """``wait`` and ``grant`` together, for a caller in this process answered as it
        arrives (the engine's hot path): no waiter, no future, a lease that never expires."""
        self.receipts.arrived(request_id, now)
        receipt = self.receipts.granted(request_id, model, now)
        return self._lease(request_id, model, actor, receipt, address, math.inf, now)

    def _lease(
        self, request_id: str, model: str, actor: str, receipt: Receipt, address: ChildAddress,
        expires_at: float, now: float,
    ) -> Lease:  # fmt: skip
        lease_id = f"{self._lease_prefix}-{next(self._lease_numbers)}"
        port = address.port
        lease = Lease(
            lease_id, request_id, model, port, expires_at, actor, receipt, address.host,
            address.key,
        )  # fmt: skip
        self._leases[lease.lease_id] = _LeaseRecord(lease, expires_at)
        self._by_request[lease.request_id] = lease.lease_id
        if expires_at != math.inf:
            heapq.heappush(self._expiries, (expires_at, lease_id))
        busy = self._models.get(model)
        if busy is None or busy.instance != port:
            self._models[model] = _ModelLeases(1, now, port)
        else:
            busy.count += 1
        return lease

    def reject(self, request_id: str, error: RouterError) -> None:
        self.receipts.forget(request_id)
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

    def end(self, lease_id: str) -> Lease | None:
        """End a lease; return it, or None if it had already ended."""
        record = self._leases.get(lease_id)
        if record is None or self.release(lease_id) is None:
            return None
        return record.lease

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
        self._remember(ended, error)
        return [lease.request_id for lease in ended]

    def lease_for(self, request_id: str) -> Lease | None:
        """The lease granted to this request, if it still runs."""
        lease_id = self._by_request.get(request_id)
        record = self._leases.get(lease_id) if lease_id is not None else None
        return None if record is None else record.lease

    def _remember(self, ended: list[Lease], error: RouterError) -> None:
        for lease in ended:
            self._revoked[lease.lease_id] = error
        while len(self._revoked) > REVOKED_KEPT:
            del self._revoked[next(iter(self._revoked))]

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
        """Fail every waiter and end every lease (shutdown); a caller whose answer then
        breaks off learns ``error`` from ``why_ended``."""
        for request_id in list(self._waiters):
            self.reject(request_id, error)
        self._remember([r.lease for r in self._leases.values()], error)
        self._leases.clear()
        self._by_request.clear()
        self._models.clear()
        self._expiries.clear()
