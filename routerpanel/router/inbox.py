"""The engine's owner loop: one asyncio task takes one command at a time (STYLE 8).

Every public method posts a command; the supervisor's reports, the timer's ticks, memory
samples and probe results come through the same inbox. Each is handled synchronously: the pure
``Scheduler`` decides and the effects layer carries the decisions out; no locks, no polling.
After every command the timer is armed with the earliest deadline (STYLE 4). An acquire or a
release that finds the inbox empty is handled at once in its caller's task (``_submit``): the
same order, one command at a time, without the hop through the queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from routerpanel.router import commands, decisions, memory, payloads, supervisor
from routerpanel.router.base import alias_map
from routerpanel.router.callers import fail, resolve
from routerpanel.router.catalogue import Event
from routerpanel.router.config import preset_map
from routerpanel.router.errors import Lease, RouterError, unavailable
from routerpanel.router.hangs import HangWatch
from routerpanel.router.scheduler import NotRunningError, UnknownModelError

log = logging.getLogger(__name__)


class Inbox(HangWatch):
    """The engine's loop layer (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handlers: dict[type[Any], Callable[[Any], None]] = {
            commands.Acquire: self._on_acquire, commands.Leave: self._on_leave,
            commands.Release: self._on_release, commands.Drop: self._on_drop,
            commands.Unload: self._on_unload,
            commands.CancelQueued: self._on_cancel_queued, commands.Reload: self._on_reload,
            commands.UpdateSettings: self._on_settings,
            commands.SetReservations: self._on_reservations,
            commands.Shutdown: self._on_shutdown, commands.Tick: self._on_tick,
            commands.MemorySampled: self._on_memory, supervisor.LogLine: self._on_log,
            commands.ProbeDone: self._on_probe, commands.Note: self._on_note,
            supervisor.ChildStarted: self._on_started, supervisor.ChildState: self._on_state,
            supervisor.ChildReady: self._on_ready, supervisor.ChildStuck: self._on_stuck,
            supervisor.ChildExited: self._on_exited,
        }  # fmt: skip

    # ---- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            command = await self._inbox.get()
            try:
                if isinstance(command, commands.Quit):
                    return
                self._handle(command)
            finally:
                self._inbox.task_done()

    def _handle(self, command: commands.Command) -> None:
        """Handle one command, then arm the timer (see module doc)."""
        self._handling = True
        try:
            self._handlers[type(command)](command)
        except Exception as exc:  # one bad command must not stop the router
            log.exception("router engine failed on %r", command)
            if isinstance(future := getattr(command, "future", None), asyncio.Future):
                fail(future, exc)  # its caller must not wait forever
        finally:
            self._handling = False
        self._rearm_timer()
        if self._closing and not self._spawning and not self._running():
            self._drained.set()

    def _submit(self, command: commands.Command) -> None:
        """A caller's command (acquire, release): handled now, in the caller's task, when that
        cannot change the order of inputs — nothing waits in the inbox, no command is being
        handled (this is not a call from inside a handler), and the caller runs on the engine's
        own loop — else posted like any other. The owner task is then parked in the inbox's
        ``get``, so handling it here is handling it next, minus two task switches (issue 16.1).
        """
        if self._inline():
            self._handle(command)
        else:
            self._post(command)

    def _inline(self) -> bool:
        """Whether a caller's input may be handled now, in the caller's task (``_submit``)."""
        task = self._loop_task
        return (
            not self._handling
            and self._inbox.empty()
            and task is not None
            and not task.done()
            and task.get_loop() is asyncio._get_running_loop()
        )

    def _rearm_timer(self) -> None:
        """Arm the timer with the earliest deadline; it runs after every command, the hot
        path's acquire and release too, so it asks only what can have a deadline."""
        due = self._scheduler.next_deadline()
        busy = self._busy()
        for at in (
            self._callers.next_expiry(),
            self._watchdog.next_deadline(busy) if busy else None,
        ):
            if at is not None and (due is None or at < due):
                due = at
        self._timer.arm(due)

    def _live_pids(self) -> dict[str, int]:
        return {name: info.pid for name, info in self._supervisor.live().items()}

    # ---- commands ---------------------------------------------------------------------------

    def _on_acquire(self, cmd: commands.Acquire) -> None:
        if cmd.future.done():  # its caller left before we got to it
            return
        if self._callers.busy(cmd.request_id):
            text = f"request id {cmd.request_id!r} is already in use"
            return fail(cmd.future, RouterError(400, "invalid_request_error", text))
        if not cmd.autoload and not self._servable(cmd.model):  # ROUTER_SPEC 8.6.4
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
        self._apply(out)

    def _on_leave(self, cmd: commands.Leave) -> None:
        self._callers.leave(cmd.request_id)
        self._apply(self._scheduler.waiter_left(cmd.request_id, now=self._clock()))

    def _on_release(self, cmd: commands.Release) -> None:
        if (request_id := self._callers.release(cmd.lease_id)) is not None:
            self._apply(self._scheduler.request_finished(request_id, now=self._clock()))

    def _on_drop(self, cmd: commands.Drop) -> None:
        if (lease := self._callers.end(cmd.lease_id)) is not None:
            self._lease_gone(lease, cmd.why)

    def _lease_gone(self, lease: Lease, why: str) -> None:
        data = {"lease_id": lease.lease_id, "request_id": lease.request_id, "why": why}
        self._emit(Event.LEASE_EXPIRED, data | {"model": lease.model, "actor": lease.actor})
        self._apply(self._scheduler.request_finished(lease.request_id, now=self._clock()))

    def _on_unload(self, cmd: commands.Unload) -> None:
        actor = cmd.actor or "anonymous"
        try:
            out = self._scheduler.unload(cmd.model, now=self._clock(), actor=actor)
        except (NotRunningError, UnknownModelError):
            text = "model is not running"
            return fail(cmd.future, RouterError(400, "invalid_request_error", text))
        self._apply(out)
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
        self._apply(out)
        resolve(cmd.future, ids)

    def _on_reload(self, cmd: commands.Reload) -> None:
        actor = cmd.actor or "anonymous"
        try:
            out = self._scheduler.reload(cmd.presets, now=self._clock(), actor=actor)
        except ValueError as exc:  # duplicate names, colliding aliases: nothing changed
            return fail(cmd.future, exc)
        old, self._specs = self._specs, preset_map(cmd.presets)
        self._aliases = alias_map(self._specs)
        self._retired.update({n: s for n, s in old.items() if n not in self._specs})
        done = payloads.reload_data(
            next(d for d in out if isinstance(d, decisions.PresetsReloaded))
        )
        self._apply(out)
        self._forget_gone()
        resolve(cmd.future, {k: v for k, v in done.items() if k != "actor"})

    def _on_settings(self, cmd: commands.UpdateSettings) -> None:
        out = self._scheduler.settings_changed(cmd.config, now=self._clock())
        self._config = cmd.config
        data = {"actor": cmd.actor or "anonymous", "config": dataclasses.asdict(cmd.config)}
        self._emit(Event.SETTINGS_CHANGED, data)
        self._apply(out)
        resolve(cmd.future, None)

    def _on_reservations(self, cmd: commands.SetReservations) -> None:
        before = self._scheduler.reservations()
        self._apply(self._scheduler.set_reservations(cmd.reservations, now=self._clock()))
        resolve(cmd.future, sorted(set(self._scheduler.reservations()) - set(before)))

    def _on_shutdown(self, cmd: commands.Shutdown) -> None:
        self._closing = True
        self._emit(Event.ROUTER_STOPPING, {"actor": cmd.actor})
        self._callers.close(unavailable("router is shutting down"))  # every child stops
        self._apply(self._scheduler.shutdown(now=self._clock(), actor=cmd.actor))
        resolve(cmd.future, None)

    def _on_tick(self, _: commands.Tick) -> None:
        now = self._clock()
        for lease in self._callers.expired(now):  # a dead web process cannot pin a model
            self._lease_gone(lease, "not renewed")
        self._apply(self._scheduler.tick(now=now))
        for name in self._watchdog.due(self._busy(), now):
            self._start_probe(name)

    def _on_note(self, cmd: commands.Note) -> None:
        self._emit(cmd.type, cmd.data)

    def _on_memory(self, cmd: commands.MemorySampled) -> None:
        sample = memory.MemorySample(time.time(), cmd.system, cmd.children)  # wall clock
        self._facts.memory.append(sample)
        busy = payloads.busy_data(self._scheduler.models(), self._callers.holders())
        self._emit(Event.MEMORY_SAMPLE, payloads.sample_data(sample) | {"in_flight": busy})
        if self._config.memory_budget is not None:  # the settle gate reads samples
            available = cmd.system.available
            self._apply(self._scheduler.memory_sample(available, now=self._clock()))
