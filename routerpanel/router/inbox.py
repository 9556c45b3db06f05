"""The engine's owner loop: one asyncio task takes one command at a time (STYLE 8).

Every public method posts a command; the supervisor's reports, the timer's ticks, memory
samples and probe results come through the same inbox. Each is handled synchronously: the pure
``Scheduler`` decides and the effects carry the decisions out; no locks, no polling. After
every command the timer is armed with the earliest deadline (STYLE 4). An acquire or a release
that finds the inbox empty is handled at once in its caller's task (``submit``): the same
order, one command at a time, without the hop through the queue.

``Inbox`` is one of the engine's parts (parts.py): it owns the queue, the loop task, whether a
command is being handled, and whether the engine is closing; it routes supervisor reports to
the effects (an ``Actuator``) and probe results to the hang watch (a ``Watch``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from routerpanel.router import commands, decisions, memory, payloads, supervisor
from routerpanel.router.callers import Callers, fail, resolve
from routerpanel.router.catalogue import Event
from routerpanel.router.errors import Lease, RouterError, unavailable
from routerpanel.router.facts import Facts
from routerpanel.router.parts import Actuator, Clock, Emit, Watch
from routerpanel.router.presettable import PresetTable
from routerpanel.router.scheduler import NotRunningError, Scheduler, UnknownModelError
from routerpanel.router.states import RUNNING
from routerpanel.router.timer import Timer

log = logging.getLogger(__name__)
T = TypeVar("T")


class Inbox:
    """The engine's loop (see module doc)."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        callers: Callers,
        effects: Actuator,
        watch: Watch,
        presets: PresetTable,
        facts: Facts,
        emit: Emit,
        clock: Clock,
        timer: Timer,
    ) -> None:
        self._scheduler, self._callers, self._effects, self._watch = (
            scheduler,
            callers,
            effects,
            watch,
        )
        self._presets, self._facts, self._emit, self._clock = presets, facts, emit, clock
        self._timer = timer
        self._queue: asyncio.Queue[commands.Command] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.handling = False  # a command is being handled now (see submit)
        self._closing = False
        self.drained = asyncio.Event()  # closing, and no child is left
        self.handlers: dict[type[Any], Callable[[Any], None]] = {
            commands.Acquire: self._on_acquire, commands.Leave: self._on_leave,
            commands.Release: self._on_release, commands.Drop: self._on_drop,
            commands.Unload: self._on_unload,
            commands.CancelQueued: self._on_cancel_queued, commands.Reload: self._on_reload,
            commands.UpdateSettings: self._on_settings,
            commands.SetReservations: self._on_reservations,
            commands.Shutdown: self._on_shutdown, commands.Tick: self._on_tick,
            commands.MemorySampled: self._on_memory, supervisor.LogLine: effects.on_log,
            commands.ProbeDone: watch.on_probe, commands.Note: self._on_note,
            supervisor.ChildStarted: effects.on_started, supervisor.ChildState: effects.on_state,
            supervisor.ChildReady: effects.on_ready, supervisor.ChildStuck: effects.on_stuck,
            supervisor.ChildExited: effects.on_exited,
        }  # fmt: skip

    # ---- the loop ---------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def closing(self) -> bool:
        """No new callers from here on (shutdown)."""
        return self._closing

    def close(self) -> None:
        self._closing = True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="router engine")

    async def stopped(self) -> None:
        """Await the loop's end (after ``commands.Quit``)."""
        if self._task is not None:
            await self._task

    def check_open(self) -> None:
        """Raise 503 unless the loop runs and the engine is not closing."""
        if self._closing:
            raise unavailable("router is shutting down")
        if not self.running:
            raise unavailable("router is not running")

    def future(self) -> asyncio.Future[Any]:
        """A future for a command's answer; raises 503 as ``check_open``."""
        self.check_open()
        return asyncio.get_running_loop().create_future()

    async def call(self, command: commands.Command, future: asyncio.Future[T]) -> T:
        """Post ``command`` and await its answer."""
        self.post(command)
        return await future

    async def load(self, name: str, load_id: str, actor: str) -> None:
        """Queue a load like a request (A9) and wait for its grant (its spawn)."""
        future: asyncio.Future[Lease | None] = self.future()
        kind = decisions.RequestKind.LOAD
        # A load answers once its spawn task ran: through the inbox, never inline.
        self.post(commands.Acquire(load_id, name, actor, kind, True, future))
        try:
            await future
        except asyncio.CancelledError:
            self.post(commands.Leave(load_id))  # A7: leave the queue
            raise

    def post(self, command: commands.Command) -> None:
        """Enqueue; never blocks (the supervisor calls it from inside stop() and kill())."""
        self._queue.put_nowait(command)

    def qsize(self) -> int:
        return self._queue.qsize()

    async def until_idle(self) -> None:
        """Return once every posted command is handled and nothing new arrives."""
        quiet = 0
        while quiet < 3:
            quiet = quiet + 1 if self._queue.empty() else 0
            await self._queue.join()
            await asyncio.sleep(0)

    async def _run(self) -> None:
        while True:
            command = await self._queue.get()
            try:
                if isinstance(command, commands.Quit):
                    return
                self._handle(command)
            finally:
                self._queue.task_done()

    def _handle(self, command: commands.Command) -> None:
        """Handle one command, then arm the timer (see module doc)."""
        self.handling = True
        try:
            self.handlers[type(command)](command)
        except Exception as exc:  # one bad command must not stop the router
            log.exception("router engine failed on %r", command)
            if isinstance(future := getattr(command, "future", None), asyncio.Future):
                fail(future, exc)  # its caller must not wait forever
        finally:
            self.handling = False
        self.rearm_timer()
        if self._closing and not self._effects.spawning and not self._running():
            self.drained.set()

    def submit(self, command: commands.Command) -> None:
        """A caller's command (acquire, release): handled now, in the caller's task, when that
        cannot change the order of inputs — nothing waits in the inbox, no command is being
        handled (this is not a call from inside a handler), and the caller runs on the engine's
        own loop — else posted like any other. The owner task is then parked in the inbox's
        ``get``, so handling it here is handling it next, minus two task switches (issue 16.1).
        """
        if self.inline():
            self._handle(command)
        else:
            self.post(command)

    def inline(self) -> bool:
        """Whether a caller's input may be handled now, in the caller's task (``submit``)."""
        task = self._task
        return (
            not self.handling
            and self._queue.empty()
            and task is not None
            and not task.done()
            and task.get_loop() is asyncio._get_running_loop()
        )

    def grant_now(self, name: str, request_id: str, actor: str, priority: str) -> Lease | None:
        """An acquire handled at once when its answer is a grant and nothing else (Engine.
        grant_now): the state ``Acquire`` leaves, without the command or its decisions."""
        if self._closing or not self.inline() or self._callers.busy(request_id):
            return None
        now = self._clock()
        held = self._scheduler.grant_at_once(
            request_id, name, now=now, actor=actor or "anonymous", priority=priority
        )
        if not held:
            return None
        address = self._facts.child(name).address
        lease = self._callers.grant_at_once(request_id, name, actor, address, now)
        self.rearm_timer()
        return lease

    def rearm_timer(self) -> None:
        """Arm the timer with the earliest deadline; it runs after every command, the hot
        path's acquire and release too, so it asks only what can have a deadline."""
        due = self._scheduler.next_deadline()
        for at in (self._callers.next_expiry(), self._watch.next_deadline()):
            if at is not None and (due is None or at < due):
                due = at
        self._timer.arm(due)

    def _running(self) -> bool:
        return any(view.state in RUNNING for view in self._scheduler.models())

    # ---- commands ---------------------------------------------------------------------------

    def _on_acquire(self, cmd: commands.Acquire) -> None:
        if cmd.future.done():  # its caller left before we got to it
            return
        if self._callers.busy(cmd.request_id):
            text = f"request id {cmd.request_id!r} is already in use"
            return fail(cmd.future, RouterError(400, "invalid_request_error", text))
        if not cmd.autoload and not self._scheduler.servable(cmd.model):  # ROUTER_SPEC 8.6.4
            text = "model is not loaded"
            return fail(cmd.future, RouterError(400, "invalid_request_error", text))
        now = self._clock()
        self._callers.wait(cmd, now)
        request, actor = cmd.request_id, cmd.actor or "anonymous"
        out = self._scheduler.request_arrived(
            request,
            cmd.model,
            now=now,
            actor=actor,
            kind=cmd.kind,
            priority=cmd.priority,
            patient=cmd.patient,
        )
        self._effects.apply(out)

    def _on_leave(self, cmd: commands.Leave) -> None:
        self._callers.leave(cmd.request_id)
        self._effects.apply(self._scheduler.waiter_left(cmd.request_id, now=self._clock()))

    def _on_release(self, cmd: commands.Release) -> None:
        if (request_id := self._callers.release(cmd.lease_id)) is not None:
            self._effects.apply(self._scheduler.request_finished(request_id, now=self._clock()))

    def _on_drop(self, cmd: commands.Drop) -> None:
        if (lease := self._callers.end(cmd.lease_id)) is not None:
            self._lease_gone(lease, cmd.why)

    def _lease_gone(self, lease: Lease, why: str) -> None:
        data = {"lease_id": lease.lease_id, "request_id": lease.request_id, "why": why}
        self._emit(Event.LEASE_EXPIRED, data | {"model": lease.model, "actor": lease.actor})
        self._effects.apply(self._scheduler.request_finished(lease.request_id, now=self._clock()))

    def _on_unload(self, cmd: commands.Unload) -> None:
        actor = cmd.actor or "anonymous"
        try:
            out = self._scheduler.unload(cmd.model, now=self._clock(), actor=actor)
        except (NotRunningError, UnknownModelError):
            text = "model is not running"
            return fail(cmd.future, RouterError(400, "invalid_request_error", text))
        self._effects.apply(out)
        resolve(cmd.future, None)

    def _on_cancel_queued(self, cmd: commands.CancelQueued) -> None:
        actor, now = cmd.actor or "anonymous", self._clock()
        out = self._scheduler.cancel_waiting(
            now=now, actor=actor, model=cmd.model, request_id=cmd.request_id
        )
        rejects = [d for d in out if isinstance(d, decisions.Reject)]
        if not rejects:
            where = f"model '{cmd.model}'" if cmd.model else f"id '{cmd.request_id}'"
            text = f"no queued request for {where}"
            return fail(cmd.future, RouterError(404, "not_found_error", text))
        ids = [d.request_id for d in rejects]
        data = {"model": rejects[0].model, "request_ids": ids, "actor": actor}
        self._emit(Event.QUEUE_CANCELLED, data | {"by_model": cmd.model is not None})
        self._effects.apply(out)
        resolve(cmd.future, ids)

    def _on_reload(self, cmd: commands.Reload) -> None:
        actor = cmd.actor or "anonymous"
        try:
            out = self._scheduler.reload(cmd.presets, now=self._clock(), actor=actor)
        except ValueError as exc:  # duplicate names, colliding aliases: nothing changed
            return fail(cmd.future, exc)
        self._presets.replace(cmd.presets)
        done = payloads.reload_data(
            next(d for d in out if isinstance(d, decisions.PresetsReloaded))
        )
        self._effects.apply(out)
        self._effects.forget_gone()
        resolve(cmd.future, {k: v for k, v in done.items() if k != "actor"})

    def _on_settings(self, cmd: commands.UpdateSettings) -> None:
        out = self._scheduler.settings_changed(cmd.config, now=self._clock())
        data = {"actor": cmd.actor or "anonymous", "config": dataclasses.asdict(cmd.config)}
        self._emit(Event.SETTINGS_CHANGED, data)
        self._effects.apply(out)
        resolve(cmd.future, None)

    def _on_reservations(self, cmd: commands.SetReservations) -> None:
        before = self._scheduler.reservations()
        self._effects.apply(self._scheduler.set_reservations(cmd.reservations, now=self._clock()))
        resolve(cmd.future, sorted(set(self._scheduler.reservations()) - set(before)))

    def _on_shutdown(self, cmd: commands.Shutdown) -> None:
        self._closing = True
        self._emit(Event.ROUTER_STOPPING, {"actor": cmd.actor})
        self._callers.close(unavailable("router is shutting down"))  # every child stops
        self._effects.apply(self._scheduler.shutdown(now=self._clock(), actor=cmd.actor))
        resolve(cmd.future, None)

    def _on_tick(self, _: commands.Tick) -> None:
        now = self._clock()
        for lease in self._callers.expired(now):  # a dead web process cannot pin a model
            self._lease_gone(lease, "not renewed")
        self._effects.apply(self._scheduler.tick(now=now))
        self._watch.probe_due(now)

    def _on_note(self, cmd: commands.Note) -> None:
        self._emit(cmd.type, cmd.data)

    def _on_memory(self, cmd: commands.MemorySampled) -> None:
        sample = memory.MemorySample(time.time(), cmd.system, cmd.children)  # wall clock
        self._facts.memory.append(sample)
        busy = payloads.busy_data(self._scheduler.models(), self._callers.holders())
        self._emit(Event.MEMORY_SAMPLE, payloads.sample_data(sample) | {"in_flight": busy})
        if self._scheduler.config.memory_budget is not None:  # the settle gate reads samples
            available = cmd.system.available
            self._effects.apply(self._scheduler.memory_sample(available, now=self._clock()))
