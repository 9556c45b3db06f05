"""Start and stop the engine: leftovers, the loop, the timer and the sampler, then the drain.

``start`` reaps what a killed router left (S8), checks which models cannot start
(preflight.py), starts the inbox's loop, the timer and the memory sampler (S9), and publishes
``router.started``. ``shutdown`` (idempotent) closes the inbox to new callers, posts
``Shutdown`` (waiters rejected, every child asked to stop within its stop-timeout), waits for
the children's exits, SIGKILLs whatever is left (S6), and ends the loop, the tasks and the feed.
``Lifecycle`` owns the tasks it starts; the engine hands it the parts it starts and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

from routerpanel.router import commands, decisions, supervisor
from routerpanel.router.callers import Callers
from routerpanel.router.catalogue import Event
from routerpanel.router.config import RouterConfig, startup_loads
from routerpanel.router.errors import unavailable
from routerpanel.router.feed import Feed
from routerpanel.router.hangs import HangWatch
from routerpanel.router.inbox import Inbox
from routerpanel.router.parts import Load
from routerpanel.router.preflight import Checks
from routerpanel.router.presettable import PresetTable
from routerpanel.router.timer import Timer, sample_memory

log = logging.getLogger("routerpanel.router.engine")  # the engine's, as before the split


SHUTDOWN_GRACE = 15.0  # past the longest stop-timeout: SIGKILL grace and reaping (S4, S6)


class Lifecycle:
    """Start and stop the engine's loop and tasks (see module doc)."""

    def __init__(
        self,
        *,
        presets: PresetTable,
        supervisor: supervisor.Supervisor,
        checks: Checks,
        inbox: Inbox,
        hangs: HangWatch,
        timer: Timer,
        feed: Feed,
        callers: Callers,
        sample_soon: asyncio.Event,
        state_file: Path | None,
        memory_interval: float | None,
    ) -> None:
        self._presets, self._supervisor, self._checks = presets, supervisor, checks
        self._inbox, self._hangs, self._timer = inbox, hangs, timer
        self._feed, self._callers, self._sample_soon = feed, callers, sample_soon
        self._state_file, self._memory_interval = state_file, memory_interval
        self._tasks: list[asyncio.Task[None]] = []  # the timer and the memory sampler
        self._shutdown_task: asyncio.Future[None] | None = None

    async def start(self, config: RouterConfig, load: Load) -> list[supervisor.Leftover]:
        """Reap leftovers (S8), start the loop, timer and sampler, then load-on-startup (A13)
        with ``load``; return the leftovers. Raises ``StartupError`` before anything starts."""
        specs = self._presets.current
        startup = startup_loads(specs.values(), config)
        leftovers: list[supervisor.Leftover] = []
        if self._state_file is not None:
            leftovers = await asyncio.to_thread(supervisor.reap_leftovers, self._state_file)
            if removed := self._supervisor.remove_stale_keys():
                log.info("removed %d child key files a previous router left", removed)
        await self._checks.check_all(specs.values())
        self._inbox.start()
        self._tasks.append(asyncio.create_task(self._timer.run(), name="router timer"))
        if self._memory_interval:
            post, soon = self._inbox.post, self._sample_soon
            sampler = sample_memory(self._memory_interval, self._live_pids, post, soon)
            self._tasks.append(asyncio.create_task(sampler, name="router memory"))
        left = [dataclasses.asdict(x) for x in leftovers]
        self._feed.publish(Event.ROUTER_STARTED, {"models": sorted(specs), "leftovers": left})
        loads = [load(name, actor="load-on-startup") for name in startup]
        results = await asyncio.gather(*loads, return_exceptions=True)
        for name, result in zip(startup, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("load on startup of %s failed: %s", name, result)
        return leftovers

    async def shutdown(self) -> None:
        """Stop every child within its stop-timeout, await the exits, end the loop. Idempotent."""
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._shut_down())
        await asyncio.shield(self._shutdown_task)

    def _live_pids(self) -> dict[str, int]:
        return {name: info.pid for name, info in self._supervisor.live().items()}

    async def _shut_down(self) -> None:
        if not self._inbox.running:
            self._feed.close()
            return
        self._inbox.close()  # no new callers from here on (the loop sets it too)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.post(commands.Shutdown(decisions.ROUTER_ACTOR, done))
        await done
        timeouts = [s.stop_timeout for s in self._presets.every()]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeouts, default=0.0) + SHUTDOWN_GRACE):
                await self._inbox.drained.wait()
        await self._supervisor.shutdown(0.0)  # whatever is left (stuck, S6): SIGKILL, await
        self._inbox.post(commands.Quit())
        await self._inbox.stopped()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._hangs.close()
        self._callers.close(unavailable("router is shutting down"))
        self._feed.close()
