"""API keys: who may call the router API and the proxy, and as whom (DESIGN §5, ROUTER_SPEC 9.1).

Two kinds of key are accepted:

* static keys from ``serve --api-key K[,K]`` or ``LLAMA_API_KEY`` (``configure(keys)``), acting as
  ``key:api-key-<n>`` (their position in the list, from 1);
* users' keys stored hashed in the database (``ApiKey``), acting as ``key:<owner>/<name>``.

A request without a valid key acts as ``anonymous``. A user's key may carry a scope (models,
concurrent requests, priority; issue 17.1): ``identify`` returns it as a ``Caller`` and
``scopes.Gate`` holds the request to it. Keys are **required** when any static key is
configured or ``RouterSettings.require_api_key`` is on. Merely having personal keys in the
database does not require them: issuing the first personal key must not lock every other client
out; it is the admin's explicit switch (llama.cpp equally requires keys only when given some).
When keys are not required, a valid key still names the actor and a wrong one is ignored, as
llama.cpp ignores ``Authorization`` when it has no key.

The key is read from ``Authorization`` (``Bearer K`` or a bare ``K``) and, when that is absent or
empty, from ``X-Api-Key``.

The hot path never waits for the database: ``KeyStore`` holds the active key hashes and the
``require_api_key`` flag in memory, re-reads them in the background when older than ``ttl``,
and at once (blocking only that request) after a save or delete in this process (signals) or
when an unknown key is presented and the table is older than ``miss_refresh``. A revoked key
therefore stops at once in this process and within ``ttl`` in other web processes. If the
database cannot be read before anything was loaded, keys are required (fail closed): static keys
keep working, everything else gets 401 until the database answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from models_app.api.audit_window import AuditWindow
from models_app.api.quotas import Limit
from models_app.db import own_connection

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
TOUCH_EVERY = 60.0  # seconds between two writes of one key's last_used_at


class Unauthorized(Exception):
    """Answer 401 ``Invalid API Key`` (ROUTER_SPEC 9.1)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request acts as, and what its key allows (issue 17.1; ``scopes.Gate`` enforces it).

    Static keys and anonymous callers are unscoped: every model, no limit, normal priority.
    """

    actor: str
    key_id: int | None = None
    models: tuple[str, ...] = ()  # fnmatch patterns; empty: every model
    max_concurrent: int | None = None  # requests in flight at once; None: no limit
    priority: str = "normal"
    quotas: tuple[Limit, ...] = ()  # its key's quota and its owner's (issue 17.4)
    queue_comments: bool = False  # streams get the queue position as comments (issue 17.7)

    def may_use(self, names: Iterable[str]) -> bool:
        """Whether the key may use a model known by ``names`` (its name and its aliases)."""
        from models_app.models import patterns_allow

        return patterns_allow(self.models, names)


ANONYMOUS_CALLER = Caller(ANONYMOUS)


@dataclass(frozen=True)
class KeyTable:
    """What the database says: whether keys are required, the active keys by hash, and every
    preset's names (name and aliases) under each of them, to check a scope by alias."""

    required: bool
    keys: Mapping[str, Caller] = field(default_factory=dict)  # hash -> caller
    operators: frozenset[str] = frozenset()  # actors whose owner may load and unload
    names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name/alias -> all names


@own_connection
def load_from_database() -> KeyTable:
    """Read the key table (sync: run it in a thread)."""
    from models_app.models import ApiKey, RouterSettings

    required = RouterSettings.objects.filter(pk=1).values_list("require_api_key", flat=True).first()
    rows = list(
        ApiKey.objects.active().values_list(
            "id", "hash", "name", "owner__username", "owner__is_superuser",
            "model_patterns", "max_concurrent", "priority", "queue_comments",
        )
    )  # fmt: skip
    quotas = _quotas()
    keys = {row[1]: _caller(row, quotas) for row in rows}
    operators = _operators({(row[3], row[4]) for row in rows})
    operator_actors = frozenset(f"key:{row[3]}/{row[2]}" for row in rows if row[3] in operators)
    return KeyTable(bool(required), keys, operator_actors, _preset_names())


def _caller(row: tuple[Any, ...], quotas: Mapping[Any, Limit]) -> Caller:
    from models_app.models import parse_model_patterns

    pk, _, name, owner, _, patterns, max_concurrent, priority, comments = row
    limits = tuple(q for q in (quotas.get(pk), quotas.get(owner)) if q is not None)
    return Caller(
        f"key:{owner}/{name}", pk, parse_model_patterns(patterns), max_concurrent, priority,
        limits, bool(comments),
    )  # fmt: skip


def _quotas() -> dict[Any, Limit]:
    """Every quota: a key's by the key's id, a user's by the user name."""
    from models_app.models import Quota

    found: dict[Any, Limit] = {}
    rows = Quota.objects.values_list(
        "key_id", "key__name", "user__username", "tokens_per_day", "requests_per_minute"
    )
    for key_id, key_name, owner, tokens, rate in rows:
        if key_id is None:
            found[owner] = Limit("user", owner, tokens, rate)
        else:
            found[key_id] = Limit("key", f"{owner}/{key_name}", tokens, rate)
    return found


def _preset_names() -> dict[str, tuple[str, ...]]:
    """Map each preset's name and each alias to all of them (name first)."""
    from models_app.models import Preset

    names: dict[str, tuple[str, ...]] = {}
    for name, aliases in Preset.objects.values_list("name", "aliases"):
        every = (name, *(a for a in aliases or () if isinstance(a, str)))
        for each in every:
            names.setdefault(each, every)
    return names


def _operators(owners: set[tuple[str, bool]]) -> set[str]:
    """Owners holding the operator role or more (roles live in the panel's groups)."""
    from django.contrib.auth import get_user_model

    names = {owner for owner, _ in owners}
    granted = (
        get_user_model()
        .objects.filter(username__in=names, is_active=True, groups__name__in=("operator", "admin"))
        .values_list("username", flat=True)
    )
    return set(granted) | {owner for owner, superuser in owners if superuser}


@own_connection
def touch_in_database(key_id: int) -> None:
    from models_app.models import ApiKey

    ApiKey.objects.filter(pk=key_id).update(last_used_at=timezone.now())


def digest(key: str | bytes) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()


def presented_key(headers: Mapping[bytes, bytes]) -> bytes | None:
    """Return the key a request carries (Authorization first, then X-Api-Key), or None."""
    value = headers.get(b"authorization", b"").strip()
    if value[:6].lower() == b"bearer" and (len(value) == 6 or value[6:7].isspace()):
        value = value[6:].strip()
    if not value:
        value = headers.get(b"x-api-key", b"").strip()
    return value or None


class KeyStore:
    """Check keys against static keys and a cached copy of the database's (see module doc)."""

    def __init__(
        self,
        loader: Callable[[], KeyTable] = load_from_database,
        toucher: Callable[[int], None] | None = touch_in_database,
        *,
        ttl: float = 10.0,
        miss_refresh: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = loader
        self._touch = toucher
        self.ttl = ttl
        self.miss_refresh = miss_refresh
        self._clock = clock
        self._static: dict[str, str] = {}
        self._table: KeyTable | None = None
        self._loaded_at = 0.0
        self._stale = True  # set by signals: the next request reloads before answering
        self._refreshing: asyncio.Future[None] | None = None
        self._touched: dict[int, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        _STORES.add(self)

    def configure(self, keys: Iterable[str]) -> None:
        """Set the static keys (``--api-key``); an empty list removes them."""
        self._static = {digest(k): f"key:api-key-{n}" for n, k in enumerate(keys, 1) if k}

    def invalidate(self) -> None:
        """Forget the cached table (a key or the settings changed); thread-safe."""
        self._stale = True

    async def authenticate(self, headers: Mapping[bytes, bytes]) -> str:
        """Return the request's actor, or raise ``Unauthorized``."""
        return (await self.identify(headers)).actor

    async def identify(self, headers: Mapping[bytes, bytes]) -> Caller:
        """Return who the request acts as and what its key allows, or raise ``Unauthorized``."""
        table = await self._current()
        key = presented_key(headers)
        if key is not None:
            hashed = digest(key)
            actor = self._static.get(hashed)
            if actor is not None:
                return Caller(actor)
            found = table.keys.get(hashed)
            if found is None and self._clock() - self._loaded_at > self.miss_refresh:
                table = await self._refresh()  # a key issued moments ago in another process
                found = table.keys.get(hashed)
            if found is not None:
                if found.key_id is not None:
                    self._note_use(found.key_id)
                return found
        if self._static or table.required:
            raise Unauthorized
        return ANONYMOUS_CALLER

    def names_of(self, model: str) -> tuple[str, ...]:
        """A requested model's names: its preset's name and aliases, or just itself if no
        preset is known by it (from the cached table: a preset renamed in another process is
        seen within ``ttl``)."""
        if self._table is None:
            return (model,)
        return self._table.names.get(model, (model,))

    def may_operate(self, actor: str) -> bool:
        """Whether ``actor`` may load and unload models: static keys and an open router may;
        a personal key only when its owner holds the operator role (or admin)."""
        if actor == ANONYMOUS or actor.startswith("key:api-key-"):
            return True
        return self._table is not None and actor in self._table.operators

    # ---- the cache ------------------------------------------------------------------------------

    async def _current(self) -> KeyTable:
        if self._table is None or self._stale:
            return await self._refresh()
        if self._clock() - self._loaded_at > self.ttl and self._refreshing is None:
            self._spawn(self._refresh())  # serve the stale table meanwhile
        return self._table

    async def _refresh(self) -> KeyTable:
        """Reload the table; concurrent callers share one database read."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._reload())
        await asyncio.shield(self._refreshing)
        assert self._table is not None
        return self._table

    async def _reload(self) -> None:
        self._stale = False
        started = self._clock()
        try:
            # Not thread-sensitive: a slow panel view must not hold up the API's key check.
            table = await sync_to_async(self._load, thread_sensitive=False)()
        except Exception:
            log.warning("could not read API keys from the database", exc_info=True)
            if self._table is None:
                self._table = KeyTable(required=True)  # fail closed; retried on the next miss
                self._loaded_at = started - self.ttl
            return
        else:
            self._table, self._loaded_at = table, started
        finally:
            self._refreshing = None

    def _note_use(self, key_id: int) -> None:
        """Record last_used_at at most once a minute per key, off the request path."""
        now = self._clock()
        if self._touch is None or now - self._touched.get(key_id, -TOUCH_EVERY) < TOUCH_EVERY:
            return
        self._touched[key_id] = now
        self._spawn(sync_to_async(self._touch, thread_sensitive=False)(key_id))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


_STORES: weakref.WeakSet[KeyStore] = weakref.WeakSet()


def _invalidate_all(**kwargs: Any) -> None:
    for store in list(_STORES):
        store.invalidate()


def connect_signals() -> None:
    """Invalidate every store when a key, a preset or the settings row changes in this
    process."""
    from models_app.models import ApiKey, Preset, RouterSettings

    for sender in (ApiKey, RouterSettings, Preset):
        post_save.connect(_invalidate_all, sender=sender, dispatch_uid=f"api-auth-{sender}")
        post_delete.connect(_invalidate_all, sender=sender, dispatch_uid=f"api-auth-del-{sender}")


DEFAULT = KeyStore()


def configure(keys: Iterable[str]) -> None:
    """Set the static keys of this process (``serve --api-key K[,K]`` / ``LLAMA_API_KEY``)."""
    DEFAULT.configure(keys)


# ---- failed logins: audited off the request path, rate-limited ---------------------------------


@own_connection
def record_in_database(count: int, details: dict[str, Any]) -> None:
    from models_app.audit.records import record_auth_failures

    record_auth_failures(count, details)


class LoginFailures(AuditWindow):
    """Audit 401s, rate-limited (``audit_window.AuditWindow``): which clients, paths and keys
    (a short hash, never the key)."""

    FIELDS = ("clients", "paths", "keys")

    def __init__(
        self,
        writer: Callable[[int, dict[str, Any]], None] = record_in_database,
        *,
        window: float = 60.0,
    ) -> None:
        super().__init__(writer, window=window)

    def note(self, scope: Mapping[str, Any], headers: Mapping[bytes, bytes]) -> None:
        """Count one failed login of the request with ``scope`` and ``headers``."""
        key = presented_key(headers)
        self.count(
            clients=client_of(scope),
            paths=scope.get("path", ""),
            keys=digest(key)[:12] if key else "none",
        )


def client_of(scope: Mapping[str, Any]) -> str:
    return str((scope.get("client") or ("unknown",))[0])
