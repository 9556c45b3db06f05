"""Scoped keys (issue 17.1): hold each API key to the models it may use and to its concurrency.

Where it applies: the proxy calls ``Gate.admit`` as soon as it knows the model (it is in the
body, §8.4) and before it asks the router for a lease; ``/models/load``, ``/models/unload``
and ``/models/cancel`` call ``Gate.check``; ``/models`` and ``/v1/models`` list only what
``Gate.visible`` keeps, and ``/models/sse`` sends only events of models ``Gate.allows``.
Static keys (``--api-key``) and anonymous callers are unscoped.

Names: a model is checked by its preset's name and all its aliases. A request by alias is in
scope when a pattern matches the preset's name or any of its aliases, so ``qwen*`` admits the
alias ``fast`` of ``qwen-7b``, and a key scoped to ``fast`` may also say ``qwen-7b``: both name
the same child. A name no preset knows is checked as given (in scope, the router answers 404).

Concurrency is counted per web process, from admission (so a queued request counts) until the
response ends, fails or the client leaves: ``Ticket.release`` runs in the proxy's ``finally``,
which cancellation and disconnects pass through too. Embedded mode is one process, so the limit
is exact there; in team mode each of N web processes counts its own requests, so a key may
have up to N × its limit in flight in all (docs/teams.md, "Scoped keys").

Refusals: 403 ``permission_error`` naming the key and the model, 429 with ``Retry-After``, both
in llama.cpp's error shape and audited through ``audit_window.AuditWindow`` (one row at once,
then at most one per minute per kind, with counts per key, model and client).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from models_app.api.audit_window import AuditWindow
from models_app.api.auth import Caller, KeyStore, client_of
from models_app.api.errors import ApiError
from models_app.api.quotas import QuotaBook
from models_app.api.request import Request
from models_app.db import own_connection

RETRY_AFTER = 1  # seconds: a slot frees when one of the key's own requests ends
SCOPE = "key_scope"  # AuditKind values (models_app.models imports Django models: not here)
BUSY = "key_busy"
QUOTA = "quota_exceeded"


@own_connection
def record_in_database(kind: str, count: int, details: dict[str, Any]) -> None:
    from models_app.audit.records import record_key_refusals

    record_key_refusals(kind, count, details)


class KeyRefusals(AuditWindow):
    """Refusals of one kind (scope or concurrency), rate-limited: which keys, models, clients."""

    FIELDS = ("keys", "models", "clients")

    def note(self, caller: Caller, model: str, request: Request) -> None:
        self.count(keys=caller.actor, models=model, clients=client_of(request.scope))


def audited(kind: str, window: float = 60.0) -> KeyRefusals:
    return KeyRefusals(functools.partial(record_in_database, kind), window=window)


class Ticket:
    """One admitted request of a key with a concurrency limit; ``release`` once, in a finally."""

    __slots__ = ("_gate", "_key_id")

    def __init__(self, gate: Gate | None, key_id: int) -> None:
        self._gate = gate
        self._key_id = key_id

    def release(self) -> None:
        if self._gate is not None:
            self._gate._leave(self._key_id)
            self._gate = None


UNCOUNTED = Ticket(None, 0)


class Gate:
    """Check requests against their key's scope and count each limited key's requests."""

    def __init__(
        self,
        keys: KeyStore,
        *,
        scope_refusals: KeyRefusals | None = None,
        busy_refusals: KeyRefusals | None = None,
        quota_refusals: KeyRefusals | None = None,
        quotas: QuotaBook | None = None,
    ) -> None:
        self._keys = keys
        self._scope_refusals = scope_refusals
        self._busy_refusals = busy_refusals
        self._quota_refusals = quota_refusals
        self.quotas = quotas or QuotaBook(
            on_refusal=quota_refusals.note if quota_refusals is not None else None
        )
        self.in_flight: dict[int, int] = {}  # key id -> admitted and not yet released

    def allows(self, caller: Caller, model: str) -> bool:
        """Whether ``caller``'s key may use ``model`` (by name or alias)."""
        return not caller.models or caller.may_use(self._keys.names_of(model))

    def check(self, request: Request, model: str) -> None:
        """Raise 403 if the request's key may not use ``model`` (by name or alias)."""
        caller = request.caller
        if not self.allows(caller, model):
            if self._scope_refusals is not None:
                self._scope_refusals.note(caller, model, request)
            allowed = ", ".join(caller.models)
            raise ApiError(
                403, f"API key {caller.actor} may not use model '{model}' (allowed: {allowed})"
            )

    def admit(self, request: Request, model: str) -> Ticket:
        """Check the scope and the quotas, then count the request against its key's limit
        (429 if full or a quota is used up)."""
        self.check(request, model)
        caller = request.caller
        if caller.quotas:
            self.quotas.check(caller, model, request)
        if caller.max_concurrent is None or caller.key_id is None:
            return UNCOUNTED
        busy = self.in_flight.get(caller.key_id, 0)
        if busy >= caller.max_concurrent:
            if self._busy_refusals is not None:
                self._busy_refusals.note(caller, model, request)
            raise ApiError(
                429,
                f"API key {caller.actor} already has {busy} requests in flight "
                f"(its limit is {caller.max_concurrent}); retry when one ends",
                "rate_limit_error",
                headers=((b"retry-after", str(RETRY_AFTER).encode()),),
            )
        self.in_flight[caller.key_id] = busy + 1
        return Ticket(self, caller.key_id)

    def _leave(self, key_id: int) -> None:
        left = self.in_flight.get(key_id, 0) - 1
        if left > 0:
            self.in_flight[key_id] = left
        else:
            self.in_flight.pop(key_id, None)

    def visible(
        self, caller: Caller, models: Iterable[Mapping[str, Any]]
    ) -> list[Mapping[str, Any]]:
        """The snapshot's models that ``caller`` may use (by name or alias)."""
        if not caller.models:
            return list(models)
        return [m for m in models if caller.may_use((m["name"], *(m.get("aliases") or ())))]

    async def drain(self) -> None:
        """Wait for the audit writes under way (tests)."""
        for refusals in (self._scope_refusals, self._busy_refusals, self._quota_refusals):
            if refusals is not None:
                await refusals.drain()
