"""Own all router state: one asyncio task reads an inbox and applies the scheduler's decisions.

The engine is the single owner (DESIGN §4, STYLE 8). Public methods only enqueue a command or
read state between two commands; ``_run`` takes one command at a time and handles it
synchronously: it feeds the pure ``Scheduler`` and applies the returned decisions through the
``Supervisor`` — Spawn in a child task (a spawn that fails posts an exit), Stop/Kill at once,
Grant and Reject by answering the caller's future. Supervisor events come through the same
inbox, so a victim's exit and its replacement's spawn are one step of one loop (A6): no locks,
no polling. Time comes from ``clock``; one timer task sleeps until the earliest of the
scheduler's ``next_deadline()`` and the lease expiries, then posts a ``Tick``.

Call everything from the event loop the engine was started on. ``renew`` is the one method that
writes without a round trip: it only moves a lease deadline, which the loop re-reads on a tick.
Tests use a fake clock, ``clock_changed()`` and ``until_idle()`` instead of sleeping (STYLE 9).

The engine is built in layers, one concept per module: ``base`` (what it owns), ``effects``
(carrying out decisions, mirroring the supervisor), ``hangs`` (the hang watchdog), ``inbox``
(the owner loop) and this module, the public API.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from routerpanel.router import commands, decisions, payloads, supervisor
from routerpanel.router.catalogue import Event
from routerpanel.router.config import PresetSpec, RouterConfig, startup_loads
from routerpanel.router.errors import Lease, RouterError, unavailable
from routerpanel.router.feed import EngineEvent, Subscription
from routerpanel.router.inbox import Inbox
from routerpanel.router.states import RUNNING
from routerpanel.router.timer import sample_memory

log = logging.getLogger(__name__)
T = TypeVar("T")
SHUTDOWN_GRACE = 15.0  # past the longest stop-timeout: SIGKILL grace and reaping (S4, S6)
RESERVATION_ACTOR = "reservation"  # who loads a reserved model in advance (issue 17.6)


class Engine(Inbox):
    """The router: admission, eviction and child processes behind one inbox."""

    # ---- public API -------------------------------------------------------------------------

    @property
    def config(self) -> RouterConfig:
        return self._config

    async def start(self) -> list[supervisor.Leftover]:
        """Reap leftovers (S8), start the loop, timer and sampler, then load-on-startup (A13).

        Raises ``StartupError`` (a ValueError) before anything starts when more models load on
        startup than ``models_max``. Returns the leftovers of a previous router, for the audit.
        """
        if self._loop_task is not None:
            raise RuntimeError("the engine is already started")
        startup = startup_loads(self._specs.values(), self._config)
        leftovers: list[supervisor.Leftover] = []
        if self._state_file is not None:
            leftovers = await asyncio.to_thread(supervisor.reap_leftovers, self._state_file)
            if removed := self._supervisor.remove_stale_keys():
                log.info("removed %d child key files a previous router left", removed)
        await self._checks.check_all(self._specs.values())
        self._loop_task = asyncio.create_task(self._run(), name="router engine")
        self._tasks.append(asyncio.create_task(self._timer.run(), name="router timer"))
        if self._memory_interval:
            pids = self._live_pids
            sampler = sample_memory(self._memory_interval, pids, self._post, self._sample_soon)
            self._tasks.append(asyncio.create_task(sampler, name="router memory"))
        left = [dataclasses.asdict(x) for x in leftovers]
        self._emit(Event.ROUTER_STARTED, {"models": sorted(self._specs), "leftovers": left})
        loads = [self.load(name, actor="load-on-startup") for name in startup]
        results = await asyncio.gather(*loads, return_exceptions=True)
        for name, result in zip(startup, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("load on startup of %s failed: %s", name, result)
        return leftovers

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
        cannot be handled now without changing the order of inputs: see ``Inbox._submit``).

        The same state as ``acquire`` with ``renewable=False`` leaves, and the same inbox
        order; what it leaves out is the command, its future and the list of decisions.
        """
        if self._closing or not self._inline():
            return None
        name = self.resolve(model)
        if name is None or self._callers.busy(request_id):
            return None
        now = self._clock()
        held = self._scheduler.grant_at_once(
            request_id, name, now=now, actor=actor or "anonymous", priority=priority
        )
        if not held:
            return None
        address = self._facts.child(name).address
        lease = self._callers.grant_at_once(request_id, name, actor, address, now)
        self._rearm_timer()
        return lease

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
        self._submit(
            commands.Acquire(
                request_id, name, actor, kind, autoload, future, renewable, klass, patient
            )
        )  # at once when the inbox is empty (Inbox._submit)
        return future

    def renew(self, lease_id: str, *, idle: float | None = None) -> bool:
        """Push the lease's expiry to now + lease_ttl; False if it is unknown (ended).

        ``idle``: seconds since the caller last sent a byte of this request's answer (the hang
        watchdog's input from another process).
        """
        now = self._clock()
        if idle is not None:
            self._callers.progress(lease_id, now - max(0.0, idle))
        return self._callers.renew(lease_id, now + self._config.lease_ttl)

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
        self._submit(commands.Release(lease_id))

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
        await self._load_request(name, load_id, actor)

    async def unload(self, model: str, *, actor: str = "") -> None:
        """Start stopping the model (busy or not); return without waiting for the exit."""
        name = self._require(model, 400, "invalid_request_error")
        done: asyncio.Future[None] = self._future()
        await self._call(commands.Unload(name, actor, done), done)

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
        result: asyncio.Future[list[str]] = self._future()
        return await self._call(commands.CancelQueued(name, request_id, actor, result), result)

    async def reload(
        self, presets: Iterable[PresetSpec], *, actor: str = ""
    ) -> dict[str, list[str]]:
        """Reconcile with new presets (A14); restart only running models whose command changed."""
        result: asyncio.Future[dict[str, list[str]]] = self._future()
        changes = await self._call(commands.Reload(tuple(presets), actor, result), result)
        await self._checks.check_all(self._specs.values())
        return changes

    async def update_settings(self, config: RouterConfig, *, actor: str = "") -> None:
        """Apply new limits: more slots are claimed at once, fewer shrink to the cap (A5)."""
        done: asyncio.Future[None] = self._future()
        await self._call(commands.UpdateSettings(config, actor, done), done)

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
        reserved: dict[str, frozenset[str]] = {}
        unknown: list[str] = []
        for model, owners in reservations.items():
            name = self.resolve(model)
            if name is None:
                unknown.append(model)
                continue
            reserved[name] = reserved.get(name, frozenset()) | frozenset(owners)
        result: asyncio.Future[list[str]] = self._future()
        added = await self._call(commands.SetReservations(reserved, actor, result), result)
        loading = [name for name in added if not self._runs(name)]
        for name in loading:
            task = asyncio.create_task(self._load_reserved(name), name=f"reservation {name}")
            self._preloads.add(task)
            task.add_done_callback(self._preloads.discard)
        return {"reserved": sorted(reserved), "loading": loading, "unknown": sorted(unknown)}

    def _runs(self, name: str) -> bool:
        view = self._scheduler.model(name)
        return view.state in RUNNING and not view.stopping

    def _refuse_unstartable(self, name: str, actor: str, request_id: str, kind: str) -> None:
        """Raise 503 at once, before the request joins the queue and anyone is evicted for it,
        when the model is not running and cannot start (preflight.py). A model that runs needs
        no start: nothing is checked."""
        if self._runs(name) or (problem := self._checks.check(self._specs[name])) is None:
            return
        data = {"model": name, "reason": problem, "actor": actor or "anonymous",
                "request_id": request_id, "kind": kind}  # fmt: skip
        self.note(Event.MODEL_REFUSED, data)
        raise RouterError(503, "unavailable_error", problem)

    async def _load_reserved(self, name: str) -> None:
        try:
            await self.load(name, actor=RESERVATION_ACTOR)
        except RouterError as exc:  # already running, shutting down, a full queue: logged
            log.info("reserved model %s was not loaded in advance: %s", name, exc.message)

    def snapshot(self) -> dict[str, Any]:
        """Return the whole state, JSON-able; events after its ``seq`` update it."""
        scheduler, feed = self._scheduler, self._feed
        snap = self._facts.snapshot(
            feed.seq, feed.changes, scheduler.models, scheduler.model, scheduler.queue(),
            self._spec, self._callers.holders(), self._config, self._wall,
        )  # fmt: skip
        use = self._scheduler.recent_use(self._clock())  # issue 17.5: who used it lately
        policy = {"policy": self._config.queue_policy.value, "recent_use": use}
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
        return name_or_alias if name_or_alias in self._specs else self._aliases.get(name_or_alias)

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
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._shut_down())
        await asyncio.shield(self._shutdown_task)

    # ---- test hooks (STYLE 9) ---------------------------------------------------------------

    def clock_changed(self) -> None:
        """Tell the timer the clock jumped (a fake clock in tests, a suspended machine)."""
        self._post(commands.Tick())
        self._timer.nudge()

    async def until_idle(self) -> None:
        """Return once every posted command is handled and nothing new arrives."""
        quiet = 0
        while quiet < 3:
            quiet = quiet + 1 if self._inbox.empty() else 0
            await self._inbox.join()
            await asyncio.sleep(0)

    def _require(self, model: str, status: int, error_type: str) -> str:
        self._check_open()
        name = self.resolve(model)
        if name is None:
            raise RouterError(status, error_type, f"model '{model}' not found")
        return name

    def _check_open(self) -> None:
        if self._closing:
            raise unavailable("router is shutting down")
        if self._loop_task is None or self._loop_task.done():
            raise unavailable("router is not running")

    def _future(self) -> asyncio.Future[Any]:
        self._check_open()
        return asyncio.get_running_loop().create_future()

    async def _call(self, command: commands.Command, future: asyncio.Future[T]) -> T:
        self._post(command)
        return await future

    async def _load_request(self, name: str, load_id: str, actor: str) -> None:
        """Queue a load like a request (A9) and wait for its grant (its spawn)."""
        future: asyncio.Future[Lease | None] = self._future()
        kind = decisions.RequestKind.LOAD
        # A load answers once its spawn task ran: through the inbox, never inline.
        self._post(commands.Acquire(load_id, name, actor, kind, True, future))
        try:
            await future
        except asyncio.CancelledError:
            self._post(commands.Leave(load_id))  # A7: leave the queue
            raise

    async def _shut_down(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._feed.close()
            return
        self._closing = True  # no new callers from here on (the loop sets it too)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._call(commands.Shutdown(decisions.ROUTER_ACTOR, done), done)
        timeouts = [s.stop_timeout for s in (*self._specs.values(), *self._retired.values())]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeouts, default=0.0) + SHUTDOWN_GRACE):
                await self._drained.wait()
        await self._supervisor.shutdown(0.0)  # whatever is left (stuck, S6): SIGKILL, await
        self._post(commands.Quit())
        await self._loop_task
        for task in (*self._tasks, *self._probes):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._probes, return_exceptions=True)
        self._callers.close(unavailable("router is shutting down"))
        self._feed.close()
