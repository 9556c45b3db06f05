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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from routerpanel.router import commands, decisions, memory, payloads, probe, supervisor, watchdog
from routerpanel.router.callers import Callers, fail, resolve
from routerpanel.router.catalogue import Event, ModelStateData
from routerpanel.router.config import PresetSpec, RouterConfig, preset_map, startup_loads
from routerpanel.router.errors import Lease, RouterError, unavailable
from routerpanel.router.facts import Facts
from routerpanel.router.feed import EngineEvent, Feed, Subscription
from routerpanel.router.scheduler import NotRunningError, Scheduler, UnknownModelError
from routerpanel.router.states import LOADED, QUARANTINED, RUNNING, SERVABLE
from routerpanel.router.timer import Timer, sample_memory

__all__ = ["Engine", "EngineEvent", "Lease", "RouterError", "Subscription"]

log = logging.getLogger(__name__)
T = TypeVar("T")
SHUTDOWN_GRACE = 15.0  # past the longest stop-timeout: SIGKILL grace and reaping (S4, S6)
EVICTIONS = (decisions.StopReason.EVICTION, decisions.StopReason.SHRINK)
HUNG = decisions.StopReason.HUNG
Post = Callable[[supervisor.SupervisorEvent], None]
Prober = Callable[[int, float], Awaitable[watchdog.Reading | None]]


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
    ) -> None:
        self._config = config
        self._specs = preset_map(presets)
        self._retired: dict[str, PresetSpec] = {}  # removed presets whose child still runs
        self._aliases = _alias_map(self._specs)
        self._scheduler = Scheduler(self._specs.values(), config)
        self._clock = clock
        self._state_file = state_file
        self._memory_interval = memory_interval
        self._supervisor = (
            supervisor_factory(self._post)
            if supervisor_factory is not None
            else supervisor.Supervisor(self._post, state_file=state_file, router_port=router_port)
        )
        self._inbox: asyncio.Queue[commands.Command] = asyncio.Queue()
        self._feed = Feed()
        self._request_rows = payloads.RequestRows()  # queued requests' rows, made once each
        self._facts = Facts(math.ceil(3600 / memory_interval) if memory_interval else 3600)
        self._callers = Callers()
        self._spawning: dict[str, asyncio.Task[None]] = {}  # until ChildStarted or the exit
        self._kill_on_start: set[str] = set()  # Kill decided while the spawn was in flight
        self._timer = Timer(clock, self._post)
        self._watchdog = watchdog.Watchdog()
        self._prober = prober
        self._hangs: dict[str, dict[str, Any]] = {}  # model -> the verdict's facts, until killed
        self._tickets: set[int] = set()  # queue entries already published (queue.changed)
        self._probes: set[asyncio.Task[None]] = set()
        self._sample_soon = asyncio.Event()
        self._drained = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._shutdown_task: asyncio.Future[None] | None = None
        self._closing = False
        self.processed = 0  # commands handled: a test hook (STYLE 9)
        self._handlers: dict[type[Any], Callable[[Any], None]] = {
            commands.Acquire: self._on_acquire, commands.Leave: self._on_leave,
            commands.Release: self._on_release, commands.Unload: self._on_unload,
            commands.CancelQueued: self._on_cancel_queued, commands.Reload: self._on_reload,
            commands.UpdateSettings: self._on_settings,
            commands.Shutdown: self._on_shutdown, commands.Tick: self._on_tick,
            commands.MemorySampled: self._on_memory, supervisor.LogLine: self._on_log,
            commands.ProbeDone: self._on_probe, commands.Note: self._on_note,
            supervisor.ChildStarted: self._on_started, supervisor.ChildState: self._on_state,
            supervisor.ChildReady: self._on_ready, supervisor.ChildStuck: self._on_stuck,
            supervisor.ChildExited: self._on_exited,
        }  # fmt: skip

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
    ) -> Lease:
        """Wait in the model's queue entry (A2) until granted; raise RouterError if rejected.

        Cancelling the awaiting task makes the waiter leave (A7) or releases a fresh grant;
        ``cancel(request_id)`` from elsewhere makes it raise RouterError 499. A caller in this
        process passes ``renewable=False``: its lease never expires, so it never renews.
        """
        name = self._require(model, 400, "invalid_request_error")
        kind = decisions.RequestKind.PROXY
        lease = await self._request(name, request_id, actor, kind, autoload, renewable)
        assert lease is not None
        return lease

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
        self._post(commands.Release(lease_id))

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
        await self._request(name, load_id, actor, decisions.RequestKind.LOAD, True)

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
        return await self._call(commands.Reload(tuple(presets), actor, result), result)

    async def update_settings(self, config: RouterConfig, *, actor: str = "") -> None:
        """Apply new limits: more slots are claimed at once, fewer shrink to the cap (A5)."""
        done: asyncio.Future[None] = self._future()
        await self._call(commands.UpdateSettings(config, actor, done), done)

    def snapshot(self) -> dict[str, Any]:
        """Return the whole state, JSON-able; events after its ``seq`` update it."""
        views, queue = self._scheduler.models(), self._scheduler.queue()
        facts, holders = self._facts, self._callers.holders()
        return facts.snapshot(
            self._feed.seq, views, queue, self._spec, holders, self._config, self._wall
        )

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

    # ---- the loop ---------------------------------------------------------------------------

    def _post(self, command: commands.Command) -> None:
        """Enqueue; never blocks (the supervisor calls it from inside stop() and kill())."""
        self._inbox.put_nowait(command)

    async def _run(self) -> None:
        while True:
            command = await self._inbox.get()
            try:
                if isinstance(command, commands.Quit):
                    return
                self._handlers[type(command)](command)
            except Exception as exc:  # one bad command must not stop the router
                log.exception("router engine failed on %r", command)
                if isinstance(future := getattr(command, "future", None), asyncio.Future):
                    fail(future, exc)  # its caller must not wait forever
            finally:
                self.processed += 1
                self._inbox.task_done()
            self._rearm_timer()
            if self._closing and not self._spawning and not self._running():
                self._drained.set()

    def _rearm_timer(self) -> None:
        watch = self._watchdog.next_deadline(self._busy())
        due = (self._scheduler.next_deadline(), self._callers.next_expiry(), watch)
        self._timer.arm(min((t for t in due if t is not None), default=None))

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
        self._callers.wait(cmd)
        request, actor = cmd.request_id, cmd.actor or "anonymous"
        now = self._clock()
        self._apply(
            self._scheduler.request_arrived(request, cmd.model, now=now, actor=actor, kind=cmd.kind)
        )

    def _on_leave(self, cmd: commands.Leave) -> None:
        self._callers.leave(cmd.request_id)
        self._apply(self._scheduler.waiter_left(cmd.request_id, now=self._clock()))

    def _on_release(self, cmd: commands.Release) -> None:
        if (request_id := self._callers.release(cmd.lease_id)) is not None:
            self._apply(self._scheduler.request_finished(request_id, now=self._clock()))

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
        self._aliases = _alias_map(self._specs)
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

    def _on_shutdown(self, cmd: commands.Shutdown) -> None:
        self._closing = True
        self._emit(Event.ROUTER_STOPPING, {"actor": cmd.actor})
        self._callers.close(unavailable("router is shutting down"))  # every child stops
        self._apply(self._scheduler.shutdown(now=self._clock(), actor=cmd.actor))
        resolve(cmd.future, None)

    def _on_tick(self, _: commands.Tick) -> None:
        now = self._clock()
        for lease in self._callers.expired(now):  # a dead web process cannot pin a model
            data = {"lease_id": lease.lease_id, "request_id": lease.request_id}
            self._emit(Event.LEASE_EXPIRED, data | {"model": lease.model, "actor": lease.actor})
            self._apply(self._scheduler.request_finished(lease.request_id, now=now))
        self._apply(self._scheduler.tick(now=now))
        for name in self._watchdog.due(self._busy(), now):
            self._start_probe(name)

    def _on_note(self, cmd: commands.Note) -> None:
        self._emit(cmd.type, cmd.data)

    # ---- the hang watchdog (watchdog.py) ----------------------------------------------------

    def _busy(self) -> list[watchdog.Busy]:
        """Loaded models with requests in flight and a hang timeout: the watchdog's charges."""
        out = []
        for name, (_, last, instance) in self._callers.in_flight().items():
            spec = self._specs.get(name)
            if spec is None or not spec.hang_timeout:
                continue
            view = self._scheduler.model(name)
            if view.state is LOADED and not view.stopping:
                out.append(watchdog.Busy(name, spec.hang_timeout, last, instance))
        return out

    def _start_probe(self, name: str) -> None:
        port = self._facts.child(name).port
        spec = self._specs.get(name)
        if port is None or spec is None or not spec.hang_timeout:
            return
        timeout = watchdog.probe_gap(spec.hang_timeout)

        async def run() -> None:
            started = self._clock()
            reading = await self._prober(port, timeout)
            self._post(commands.ProbeDone(name, port, reading, self._clock() - started))

        task = asyncio.create_task(run(), name=f"probe {name}")
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def _on_probe(self, done: commands.ProbeDone) -> None:
        spec = self._specs.get(done.model)
        if spec is None or not spec.hang_timeout:
            return
        now = self._clock()
        verdict = self._watchdog.judge(
            done.model, done.instance, done.reading, now, spec.hang_timeout
        )
        if verdict is not watchdog.Verdict.HUNG:
            return
        busy = self._callers.in_flight().get(done.model)
        idle = now - busy[1] if busy is not None else spec.hang_timeout
        if done.reading is None:
            how = f"no answer to GET /slots within {done.seconds:.1f} s"
        else:
            gap = watchdog.probe_gap(spec.hang_timeout)
            how = f"its progress counters did not move in {gap:g} s"
        self._kill_hung(done.model, idle, how)

    def _kill_hung(self, name: str, idle: float, how: str) -> None:
        """End the hung child's requests with a clear error, then SIGKILL its group (S4)."""
        facts = self._facts.child(name)
        holders = self._callers.holders().get(name, {})
        text = (
            f"model name={name} stopped responding (no progress for {idle:.0f} s) and was "
            "killed; the next request starts it again"
        )
        self._hangs[name] = {
            "model": name, "pid": facts.pid, "port": facts.port, "idle_seconds": round(idle, 3),
            "in_flight": sum(holders.values()), "holders": holders, "probe": how,
        }  # fmt: skip
        error = RouterError(503, "unavailable_error", text, retry_after=1)
        ended = self._callers.revoke(name, error)
        now = self._clock()
        self._apply(self._scheduler.child_hung(name, now=now))
        for request_id in ended:
            self._apply(self._scheduler.request_finished(request_id, now=now))

    def _on_memory(self, cmd: commands.MemorySampled) -> None:
        sample = memory.MemorySample(time.time(), cmd.system, cmd.children)  # wall clock
        self._facts.memory.append(sample)
        busy = payloads.busy_data(self._scheduler.models(), self._callers.holders())
        self._emit(Event.MEMORY_SAMPLE, payloads.sample_data(sample) | {"in_flight": busy})
        if self._config.memory_budget is not None:  # the settle gate reads samples
            available = cmd.system.available
            self._apply(self._scheduler.memory_sample(available, now=self._clock()))

    # ---- supervisor events ------------------------------------------------------------------

    def _on_log(self, line: supervisor.LogLine) -> None:
        data = {"model": line.name, "stream": line.stream, "text": line.text, "time": line.time}
        self._emit(Event.MODEL_LOG, data)

    def _on_started(self, ev: supervisor.ChildStarted) -> None:
        self._spawning.pop(ev.name, None)
        self._facts.started(ev)
        if ev.name in self._kill_on_start:  # S4: killed while its spawn was in flight
            self._supervisor.kill(ev.name)

    def _on_state(self, ev: supervisor.ChildState) -> None:
        if ev.state in ("loading", "downloading"):
            self._facts.child(ev.name).progress = ev.payload
            if ev.payload:  # llama.cpp streams these as status_change{loading, progress} (§10.5)
                self._emit(Event.MODEL_PROGRESS, {"model": ev.name, "progress": ev.payload})
        if ev.state != "downloading":
            self._apply(self._scheduler.child_state(ev.name, ev.state, now=self._clock()))

    def _on_ready(self, ev: supervisor.ChildReady) -> None:
        self._facts.ready(ev)
        out = self._scheduler.child_ready(ev.name, now=self._clock())
        note: ModelStateData = {"load_seconds": ev.load_seconds}
        note["loaded_for"] = self._facts.child(ev.name).spawned_for  # who the load was for
        if ev.info:  # the child's /v1/models object, sent with its first ready (ROUTER_SPEC 4.9)
            note["info"] = ev.info
        self._apply(out, note=(ev.name, note))

    def _on_stuck(self, ev: supervisor.ChildStuck) -> None:
        state = self._scheduler.model(ev.name).state.value
        self._emit(Event.MODEL_STUCK, payloads.stuck_data(ev, state))
        self._apply(self._scheduler.child_stuck(ev.name, now=self._clock()))

    def _on_exited(self, ev: supervisor.ChildExited) -> None:
        """Free the slot (A6): the scheduler may spawn the next model in this same step."""
        self._spawning.pop(ev.name, None)
        self._kill_on_start.discard(ev.name)
        tail = tuple(line.text for line in ev.last_lines)
        now = self._clock()
        before = self._scheduler.model(ev.name).state.value
        out = self._scheduler.child_exited(ev.name, now=now, exit_code=ev.exit_code, log_tail=tail)
        if self._config.memory_budget is not None:
            self._sample_soon.set()  # the settle gate waits for a fresh sample
        state = next((v.state.value for v in self._scheduler.models() if v.name == ev.name), None)
        self._emit(Event.MODEL_EXITED, self._facts.exited(ev, state, before))
        self._apply(out)
        self._forget_gone()

    # ---- decisions --------------------------------------------------------------------------

    def _apply(
        self, out: list[decisions.Decision], note: tuple[str, ModelStateData] | None = None
    ) -> None:
        """Carry out decisions in order; follow-ups (a grant nobody takes) go last."""
        pending = deque(out)
        while pending:
            decision = pending.popleft()
            if isinstance(decision, decisions.StateChanged):  # paired with the action after it
                nxt = pending[0] if pending else None
                data = payloads.state_data(decision, nxt)
                if note is not None and note[0] == decision.model:
                    data.update(note[1])
                if decision.to_state is QUARANTINED:  # what the quarantined child last said
                    data["log_tail"] = list(self._scheduler.model(decision.model).log_tail)
                if isinstance(nxt, decisions.Spawn) and nxt.model == decision.model:
                    self._facts.child(decision.model).spawned_for = nxt.trigger.actor
                self._facts.child(decision.model).state_since = time.time()
                self._emit(Event.MODEL_STATE, data)
            else:
                pending.extend(self._act(decision))

    def _act(self, decision: decisions.Decision) -> list[decisions.Decision]:
        if isinstance(decision, decisions.Grant):
            port = self._facts.child(decision.model).port or 0
            now = self._clock()
            renewable = self._callers.renewable(decision.request_id)
            expires = now + self._config.lease_ttl if renewable else math.inf
            if not self._callers.grant(decision, port, expires, now):  # its caller left (A7)
                return self._scheduler.request_finished(decision.request_id, now=now)
        elif isinstance(decision, decisions.Reject):
            self._callers.reject(decision.request_id, RouterError.from_reject(decision))
        elif isinstance(decision, decisions.Spawn):
            self._spawn(decision)
        elif isinstance(decision, decisions.Stop | decisions.Kill):
            self._stop(decision)
        elif isinstance(decision, decisions.QueueChanged):
            data = payloads.queue_data(decision.entries, self._wall, self._request_rows)
            tickets = {e.ticket for e in decision.entries}
            data["added"] = [e.ticket for e in decision.entries
                             if e.ticket not in self._tickets and not e.restart]  # fmt: skip
            self._tickets = tickets
            self._emit(Event.QUEUE_CHANGED, data)
        elif isinstance(decision, decisions.Settled):
            self._emit(Event.MEMORY_SETTLED, dataclasses.asdict(decision))
        elif isinstance(decision, decisions.BackedOff):
            until = time.time() + decision.seconds
            self._emit(Event.MODEL_BACKOFF, dataclasses.asdict(decision) | {"until": until})
        elif isinstance(decision, decisions.PresetsReloaded):
            self._emit(Event.PRESETS_RELOADED, payloads.reload_data(decision))
        return []

    def _spawn(self, spawn: decisions.Spawn) -> None:
        # unloaded -> loading happened in the scheduler: the slot is real (A6)
        self._facts.spawning(spawn.model, spawn.spec.argv)
        task = asyncio.create_task(self._spawn_child(spawn.spec), name=f"spawn {spawn.model}")
        self._spawning[spawn.model] = task

    async def _spawn_child(self, spec: PresetSpec) -> None:
        """Spawn; a spawn that raises is reported as an exit, as the scheduler expects."""
        try:
            await self._supervisor.spawn(
                spec.name, spec.argv, dict(spec.env),
                child_protocol=spec.speaks_child_protocol, load_timeout=spec.load_timeout,
            )  # fmt: skip
        except Exception as exc:  # no process, but the slot must be freed all the same
            error = str(exc) if isinstance(exc, supervisor.SpawnError) else f"spawn failed: {exc}"
            log.warning("spawning %s failed: %s", spec.name, error)
            self._post(payloads.spawn_failure(spec.name, error))

    def _stop(self, decision: decisions.Stop | decisions.Kill) -> None:
        """Publish who is stopped and why (the audit journals it first), then stop or kill."""
        name = decision.model
        frm = self._scheduler.model(name).state.value
        action = "stop" if isinstance(decision, decisions.Stop) else "kill"
        if decision.reason in EVICTIONS:
            data = payloads.eviction_data(decision, self._facts.latest, frm)
            self._emit(Event.MODEL_EVICTED, data)
        elif decision.reason is HUNG:
            hung = self._hangs.pop(name, {"model": name})
            self._emit(Event.MODEL_HUNG, hung | {"from_state": frm, "action": action})
        if isinstance(decision, decisions.Stop):
            done = self._supervisor.stop(name, decision.stop_timeout)  # S4: SIGKILL at deadline
        else:
            done = self._supervisor.kill(name)
        if not done and name in self._spawning:
            self._kill_on_start.add(name)  # its ChildStarted delivers the kill

    # ---- helpers ----------------------------------------------------------------------------

    def _emit(self, type_: Event, data: Mapping[str, Any]) -> None:
        self._feed.publish(type_, data)

    def _wall(self, t: float) -> float:
        return time.time() - (self._clock() - t)

    def _spec(self, name: str) -> PresetSpec | None:
        return self._specs.get(name) or self._retired.get(name)

    def _running(self) -> bool:
        return any(view.state in RUNNING for view in self._scheduler.models())

    def _servable(self, name: str) -> bool:
        try:
            view = self._scheduler.model(name)
        except UnknownModelError:
            return False
        return view.state in SERVABLE and not view.stopping

    def _forget_gone(self) -> None:
        """Drop what we keep of removed presets once the scheduler has forgotten them (A14)."""
        known = {view.name for view in self._scheduler.models()}
        for name in [n for n in self._retired if n not in known]:
            del self._retired[name]
            self._facts.forget(name)
            self._supervisor.forget_logs(name)

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

    async def _request(
        self,
        name: str,
        request_id: str,
        actor: str,
        kind: decisions.RequestKind,
        autoload: bool,
        renewable: bool = True,
    ) -> Lease | None:
        future: asyncio.Future[Lease | None] = self._future()
        acquire = commands.Acquire(request_id, name, actor, kind, autoload, future, renewable)
        try:
            return await self._call(acquire, future)
        except asyncio.CancelledError:
            self._post(commands.Leave(request_id))  # A7: leave the queue, or release a grant
            raise

    async def _shut_down(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._feed.close()
            return
        self._closing = True  # no new callers from here on (the loop sets it too)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._call(commands.Shutdown("shutdown", done), done)
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


def _alias_map(specs: dict[str, PresetSpec]) -> dict[str, str]:
    return {alias: spec.name for spec in specs.values() for alias in spec.aliases}
