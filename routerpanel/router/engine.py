"""Own all router state: one asyncio task reads an inbox and applies the scheduler's decisions.

The engine is the single owner (DESIGN §4, STYLE 8). Public methods only enqueue a command or
read state between two commands. It owns its parts, each with its own state and handed, when
it is built, what it uses of the others (parts.py): the ``Inbox`` takes one command at a time
and feeds the pure ``Scheduler``; the ``Effects`` carry the decisions out through the
``Supervisor`` and mirror its reports; the ``HangWatch`` probes busy children; ``Lifecycle``
starts and stops them; ``Reservations`` loads newly reserved models in advance. Beside them:
the preset table, the callers' book, feed, facts, timer.

Call everything from the event loop the engine was started on. ``renew`` is the one method that
writes without a round trip: it only moves a lease deadline, which the loop re-reads on a tick.
Tests use a fake clock, ``clock_changed()`` and ``until_idle()`` instead of sleeping (STYLE 9).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from routerpanel.router import commands, decisions, payloads, probe, supervisor
from routerpanel.router.callers import Callers
from routerpanel.router.catalogue import Event
from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.effects import Effects
from routerpanel.router.errors import Lease, RouterError
from routerpanel.router.facts import Facts
from routerpanel.router.feed import EngineEvent, Feed, Subscription
from routerpanel.router.hangs import HangWatch
from routerpanel.router.inbox import Inbox
from routerpanel.router.lifecycle import Lifecycle
from routerpanel.router.parts import Post, Prober, wall_clock
from routerpanel.router.preflight import Checks, Preflight
from routerpanel.router.preflight import check as preflight_check
from routerpanel.router.presettable import PresetTable
from routerpanel.router.reservations import RESERVATION_ACTOR, Reservations
from routerpanel.router.scheduler import Scheduler
from routerpanel.router.states import RUNNING
from routerpanel.router.timer import Timer

__all__ = ["RESERVATION_ACTOR", "Engine"]


class Engine:
    """The router: admission, eviction and child processes behind one inbox."""

    def __init__(
        self,
        config: RouterConfig,
        presets: Iterable[PresetSpec],
        *,
        state_file: Path | None = None,
        memory_interval: float | None = 1.0,
        clock: Callable[[], float] = time.monotonic,
        supervisor_factory: Callable[[Post], supervisor.Supervisor] | None = None,
        router_port: int = 0,
        prober: Prober = probe.read_slots,
        preflight: Preflight = preflight_check,
    ) -> None:
        self._presets = PresetTable(presets)
        self._scheduler = Scheduler(self._presets.current.values(), config)  # holds the config
        self._clock, self._wall = clock, wall_clock(clock)
        self._supervisor = (
            supervisor_factory(self._post)
            if supervisor_factory is not None
            else supervisor.Supervisor(self._post, state_file=state_file, router_port=router_port)
        )
        self._feed = Feed()
        self._facts = Facts(math.ceil(3600 / memory_interval) if memory_interval else 3600)
        self._callers = Callers()
        self._timer = Timer(clock, self._post)
        self._checks = Checks(preflight)  # which models cannot start (preflight.py)
        sample_soon = asyncio.Event()  # the memory sampler samples at once (settle gate)
        self._effects = Effects(
            scheduler=self._scheduler, supervisor=self._supervisor, callers=self._callers,
            facts=self._facts, presets=self._presets, emit=self._feed.publish, post=self._post,
            clock=clock, sample_soon=sample_soon,
        )  # fmt: skip
        self._hangs = HangWatch(
            presets=self._presets, scheduler=self._scheduler, callers=self._callers,
            facts=self._facts, effects=self._effects, post=self._post, clock=clock, prober=prober,
        )  # fmt: skip
        self._inbox = Inbox(
            scheduler=self._scheduler, callers=self._callers, effects=self._effects,
            watch=self._hangs, presets=self._presets, facts=self._facts,
            emit=self._feed.publish, clock=clock, timer=self._timer,
        )  # fmt: skip
        self._life = Lifecycle(
            presets=self._presets, supervisor=self._supervisor, checks=self._checks,
            inbox=self._inbox, hangs=self._hangs, timer=self._timer, feed=self._feed,
            callers=self._callers, sample_soon=sample_soon, state_file=state_file,
            memory_interval=memory_interval,
        )  # fmt: skip
        self._reservations = Reservations(
            inbox=self._inbox, resolve=self.resolve, runs=self._runs, load=self.load
        )  # the loads in advance of newly reserved models

    def _post(self, command: commands.Command) -> None:
        """Into the inbox; never blocks (the parts and the supervisor post through it)."""
        self._inbox.post(command)

    # ---- public API -------------------------------------------------------------------------

    @property
    def config(self) -> RouterConfig:
        return self._scheduler.config

    async def start(self) -> list[supervisor.Leftover]:
        """Reap leftovers (S8), start the loop, timer and sampler, then load-on-startup (A13).

        Raises ``StartupError`` (a ValueError) before anything starts when more models load on
        startup than ``models_max``. Returns the leftovers of a previous router, for the audit.
        """
        if self._inbox.started:
            raise RuntimeError("the engine is already started")
        return await self._life.start(self.config, self.load)

    async def acquire(
        self,
        model: str,
        *,
        request_id: str,
        actor: str = "",
        autoload: bool = True,
        renewable: bool = True,
        priority: str = "normal",
        patient: bool = False,
    ) -> Lease:
        """Wait in the model's queue entry (A2) until granted; raise RouterError if rejected.

        ``priority`` (low, normal, high: the API key's class) orders entries under the ``fair``
        queue policy; an unknown class raises ValueError. ``patient``: wait even when every
        slot is held by a model only an operator can stop (else 503 at once, blocked.py).

        Cancelling the awaiting task makes the waiter leave (A7) or releases a fresh grant;
        ``cancel(request_id)`` from elsewhere makes it raise RouterError 499. A caller in this
        process passes ``renewable=False``: its lease never expires, so it never renews.
        """
        future = self.acquire_soon(
            model, request_id=request_id, actor=actor, autoload=autoload, renewable=renewable,
            priority=priority, patient=patient,
        )  # fmt: skip
        try:
            return await future
        except asyncio.CancelledError:
            self.cancel(request_id)  # A7: leave the queue, or release a grant
            raise

    def grant_now(
        self, model: str, *, request_id: str, actor: str = "", priority: str = "normal"
    ) -> Lease | None:
        """``acquire`` for a caller in this process when the answer is a grant at once: a
        loaded model, nothing queued (issue 16.5's hot path). Returns the lease, which never
        expires, or None when the request must take ``acquire`` (a model to load or wait
        for, an unknown name, a request id in use, the engine closing, or an input that
        cannot be handled now without changing the order of inputs: see ``Inbox.submit``).

        The same state as ``acquire`` with ``renewable=False`` leaves, and the same inbox
        order; what it leaves out is the command, its future and the list of decisions.
        """
        name = self.resolve(model)
        return None if name is None else self._inbox.grant_now(name, request_id, actor, priority)

    def acquire_soon(
        self,
        model: str,
        *,
        request_id: str,
        actor: str = "",
        autoload: bool = True,
        renewable: bool = True,
        priority: str = "normal",
        patient: bool = False,
    ) -> asyncio.Future[Lease]:
        """``acquire`` without a coroutine: the request is submitted now, and when the inbox is
        idle it is decided now too, so the future may be done when this returns (a grant on a
        loaded model, a rejection). Raises RouterError for an unknown model, like ``acquire``.

        A caller that gives up before the future is done, or does not want the grant it holds,
        calls ``cancel(request_id)`` (A7: it leaves the queue, or its grant is released).
        """
        name = self._require(model, 400, "invalid_request_error")  # open, or RouterError
        self._refuse_unstartable(name, actor, request_id, "request")
        klass = decisions.priority_of(priority)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        kind = decisions.RequestKind.PROXY
        self._inbox.submit(
            commands.Acquire(
                request_id, name, actor, kind, autoload, future, renewable, klass, patient
            )
        )  # at once when the inbox is empty (Inbox.submit)
        return future

    def renew(self, lease_id: str, *, idle: float | None = None) -> bool:
        """Push the lease's expiry to now + lease_ttl; False if it is unknown (ended).

        ``idle``: seconds since the caller last sent a byte of this request's answer (the hang
        watchdog's input from another process).
        """
        now = self._clock()
        if idle is not None:
            self._callers.progress(lease_id, now - max(0.0, idle))
        return self._callers.renew(lease_id, now + self.config.lease_ttl)

    def progress(self, lease_id: str) -> None:
        """A byte of the leased request's answer went out now: the child is not hung. Cheap
        enough to call per chunk; writes without a round trip, like ``renew``."""
        self._callers.progress(lease_id, self._clock())

    def why_ended(self, lease_id: str) -> RouterError | None:
        """Return the error the router ended this lease with (a hung child), or None."""
        return self._callers.why_ended(lease_id)

    def lease_for(self, request_id: str) -> Lease | None:
        """Return the lease granted to this request while it runs (a caller lost the grant)."""
        return self._callers.lease_for(request_id)

    def queue_position(self, model: str) -> int:
        """Return the model's 1-based place in the queue, 0 when it has no entry (cheap)."""
        name = self.resolve(model) or model
        return next((e.position for e in self._scheduler.queue() if e.model == name), 0)

    def note(self, type_: Event, data: Mapping[str, Any]) -> None:
        """Publish an adapter's fact (a dropped message) in order with the engine's events."""
        self._post(commands.Note(type_, data))

    def release(self, lease_id: str) -> None:
        """Finish the leased request; idempotent."""
        self._inbox.submit(commands.Release(lease_id))

    def drop(self, lease_id: str, *, why: str) -> None:
        """End a lease whose holder is gone (``why``: how we know); idempotent. Published as
        ``lease.expired`` with ``why``, like a lease that was not renewed in time."""
        self._post(commands.Drop(lease_id, why))

    def cancel(self, request_id: str) -> None:
        """Make a queued waiter leave (A7), or release the request's lease."""
        self._post(commands.Leave(request_id))

    async def load(self, model: str, *, actor: str = "") -> None:
        """Queue a load like a request (A9); return once it is spawned. Raises RouterError.

        A running model answers 400 ``model is already running``, as llama.cpp does (ROUTER_SPEC
        9.9); a stopping one queues for its next instance.
        """
        name = self._require(model, 404, "not_found_error")
        load_id = f"load-{uuid.uuid4().hex}"
        self._refuse_unstartable(name, actor, load_id, "load")  # a running one: 400 as before
        await self._inbox.load(name, load_id, actor)

    async def unload(self, model: str, *, actor: str = "") -> None:
        """Start stopping the model (busy or not); return without waiting for the exit."""
        name = self._require(model, 400, "invalid_request_error")
        done: asyncio.Future[None] = self._inbox.future()
        await self._inbox.call(commands.Unload(name, actor, done), done)

    async def cancel_queued(
        self, *, model: str | None = None, request_id: str | None = None, actor: str = ""
    ) -> list[str]:
        """Reject queued requests with 499: one by request id, or all of a model's entry.

        Returns the cancelled request ids; raises RouterError 404 when nothing waits there.
        Requests already granted are running and are not touched (unload stops those).
        """
        if (model is None) == (request_id is None):
            raise RouterError(400, "invalid_request_error", "give either model or request_id")
        name = self._require(model, 404, "not_found_error") if model is not None else None
        result: asyncio.Future[list[str]] = self._inbox.future()
        return await self._inbox.call(
            commands.CancelQueued(name, request_id, actor, result), result
        )

    async def reload(
        self, presets: Iterable[PresetSpec], *, actor: str = ""
    ) -> dict[str, list[str]]:
        """Reconcile with new presets (A14); restart only running models whose command changed."""
        result: asyncio.Future[dict[str, list[str]]] = self._inbox.future()
        changes = await self._inbox.call(commands.Reload(tuple(presets), actor, result), result)
        await self._checks.check_all(self._presets.current.values())
        return changes

    async def update_settings(self, config: RouterConfig, *, actor: str = "") -> None:
        """Apply new limits: more slots are claimed at once, fewer shrink to the cap (A5)."""
        done: asyncio.Future[None] = self._inbox.future()
        await self._inbox.call(commands.UpdateSettings(config, actor, done), done)

    async def set_reservations(
        self, reservations: Mapping[str, Iterable[str]], *, actor: str = ""
    ) -> dict[str, list[str]]:
        """Replace the reservations with the whole current set (issue 17.6): model (name or
        alias) -> the owners (``user:<name>``) it is reserved for. Idempotent.

        A reserved model is pinned and its owners' requests go first in its entry (R1, R2 in
        scheduler.py). A model newly reserved that is not running is loaded in advance by the
        actor ``reservation``, through the queue like any load (A9): unload before load and
        models_max hold. Returns ``reserved``, ``loading`` (the loads started) and ``unknown``.
        """
        return await self._reservations.replace(reservations, actor)

    def _runs(self, name: str) -> bool:
        view = self._scheduler.model(name)
        return view.state in RUNNING and not view.stopping

    def _refuse_unstartable(self, name: str, actor: str, request_id: str, kind: str) -> None:
        """Raise 503 at once, before the request joins the queue and anyone is evicted for it,
        when the model is not running and cannot start (preflight.py). A model that runs needs
        no start: nothing is checked."""
        spec = self._presets.current[name]
        if self._runs(name) or (problem := self._checks.check(spec)) is None:
            return
        data = {"model": name, "reason": problem, "actor": actor or "anonymous",
                "request_id": request_id, "kind": kind}  # fmt: skip
        self.note(Event.MODEL_REFUSED, data)
        raise RouterError(503, "unavailable_error", problem)

    def snapshot(self) -> dict[str, Any]:
        """Return the whole state, JSON-able; events after its ``seq`` update it."""
        scheduler, feed = self._scheduler, self._feed
        snap = self._facts.snapshot(
            feed.seq, feed.changes, scheduler.models, scheduler.model, scheduler.queue(),
            self._presets.spec, self._callers.holders(), self.config, self._wall,
        )  # fmt: skip
        use = self._scheduler.recent_use(self._clock())  # issue 17.5: who used it lately
        policy = {"policy": self.config.queue_policy.value, "recent_use": use}
        reserved = {name: sorted(o) for name, o in sorted(self._scheduler.reservations().items())}
        for entry in snap["models"]:
            entry["cannot_start"] = self._checks.why(entry["name"])
        return snap | {"queue_policy": policy, "reservations": reserved}

    def problems(self) -> list[str]:
        """What the router could not do but goes on without (its state file unwritten)."""
        problem = self._supervisor.state_problem
        return [problem] if problem else []

    def status(self) -> dict[str, Any]:
        """A cheap summary: how many models, how many run, how many requests wait."""
        views = self._scheduler.models()
        running = sum(1 for view in views if view.state in RUNNING)
        waiting = sum(entry.waiters for entry in self._scheduler.queue())
        return {"models": len(views), "running": running, "queued": waiting}

    def memory_history(self) -> list[dict[str, Any]]:
        """Return the one-hour ring of memory samples, oldest first (S9)."""
        return [payloads.sample_data(s) for s in self._facts.memory]

    def logs(self, model: str) -> list[dict[str, Any]]:
        """Return the model's log ring buffer (S7): time (wall), stream, text."""
        lines = self._supervisor.logs(self.resolve(model) or model)
        return [{"time": x.time, "stream": x.stream, "text": x.text} for x in lines]

    def resolve(self, name_or_alias: str) -> str | None:
        """Return the preset name for a name or alias, or None."""
        return self._presets.resolve(name_or_alias)

    def add_tap(self, tap: Callable[[EngineEvent], None]) -> None:
        """Call ``tap`` synchronously with every event, before its decision takes effect (the
        audit journal). Add taps before ``start()`` to see ``router.started``."""
        self._feed.taps.append(tap)

    def subscribe(self, maxsize: int = 1000) -> Subscription:
        """Return a bounded event stream; a slow reader sees a seq gap, never blocks the engine.

        Subscribe first, then take a snapshot() and skip events whose seq is not above its seq.
        """
        return self._feed.subscribe(maxsize)

    async def shutdown(self) -> None:
        """Reject waiters, stop every child within its stop-timeout, await the exits. Idempotent."""
        await self._life.shutdown()

    # ---- test hooks (STYLE 9) ---------------------------------------------------------------

    def clock_changed(self) -> None:
        """Tell the timer the clock jumped (a fake clock in tests, a suspended machine)."""
        self._post(commands.Tick())
        self._timer.nudge()

    async def until_idle(self) -> None:
        """Return once every posted command is handled and nothing new arrives."""
        await self._inbox.until_idle()

    def _require(self, model: str, status: int, error_type: str) -> str:
        self._inbox.check_open()
        name = self.resolve(model)
        if name is None:
            raise RouterError(status, error_type, f"model '{model}' not found")
        return name
