"""Run the router in a process: the one start-up path of ``serve`` and ``runrouter``.

``RouterProcess`` takes the router's locks (locks.py) before anything starts, then starts the
engine host (routing/host.py), the Channels worker for channel ``router`` and the lock
keeper; ``stop()`` stops every child within its stop-timeout. ``serve`` runs it inside Daphne's
event loop (embedded mode, where the web side calls the engine in-process); ``runrouter`` in an
event loop of its own (team mode). Either way the process keeps serving through Redis
outages: the channel listener restarts, the heartbeat and the lock refresh retry.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import resource
import sys
from collections.abc import Callable
from typing import Any

from django.conf import settings

from models_app import runtime
from models_app.audit.mapper import new_router_id
from models_app.presets import sources, specs
from models_app.routing import topology
from models_app.routing.locks import LockLost, RouterLock

log = logging.getLogger(__name__)

OPEN_FILES = 65536  # a burst of 1,000 clients is 2,000+ sockets (client side and upstream)


def raise_open_files_limit(wanted: int = OPEN_FILES) -> int:
    """Raise this process's soft limit on open files toward ``wanted`` (macOS starts at 256).

    Returns the limit in force; never fails (a refused raise leaves the limit as it was).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = hard if hard != resource.RLIM_INFINITY else wanted
    if sys.platform == "darwin":
        ceiling = min(ceiling, 10240)  # OPEN_MAX: setrlimit refuses more on macOS
    target = min(wanted, ceiling)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            log.warning("could not raise the open-files limit above %d", soft)
    return soft


def child_keys(mode: str, advertise: str | None) -> bool:
    """Whether children get a per-spawn --api-key: ``on``, ``off``, or ``auto`` (when they
    listen on an address other machines may reach, i.e. not loopback)."""
    if mode != "auto":
        return mode == "on"
    return not is_loopback(advertise or "127.0.0.1")


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return address == "localhost"


def link_tcp(advertise: str, port: int | None) -> Any:
    """Where the router link listens for other hosts (link_server.py): on the advertised
    address at ``port`` (``--link-port``; 0: any free port); without a port, only when the
    address is not loopback (other machines reach it), at any free port. None: Unix only."""
    from models_app.routing.link import Address

    if port is None and is_loopback(advertise):
        return None
    return Address("tcp", host=advertise.strip("[]"), port=port or 0)


class RouterProcess:
    """The router of this process (see module doc); ``options`` are the command's flags."""

    def __init__(
        self, options: dict[str, Any], *, on_failure: Callable[[str], None], link: bool = False
    ) -> None:
        from channels.layers import get_channel_layer

        from models_app.routing.host import RouterHost

        self.boot = new_router_id()
        node = topology.check_name(options.get("node") or "")
        self.lock = RouterLock(self.boot, redis_url=settings.REDIS_URL or "", node=node)
        self.on_failure = on_failure  # told (once) when the router cannot go on
        overrides = specs.Overrides(
            models_max=options["models_max"],
            max_wait=options.get("max_wait"),
            server_bin=options["server_bin"],
            lease_ttl=options["lease_ttl"],
            queue_policy=options.get("queue_policy"),
            node=node,
            advertise=options.get("advertise") or "127.0.0.1",
            child_keys=child_keys(options.get("child_keys") or "auto", options.get("advertise")),
        )
        self.host = RouterHost(
            get_channel_layer(),
            overrides=overrides,
            state_file=settings.DATA_DIR / "children.json",
            before_reload=functools.partial(reimport_sources, runtime.current()),
            boot=self.boot,
        )
        if link and settings.REDIS_URL and settings.ROUTERPANEL_ROUTER_LINK:
            from models_app.routing.link import Address, socket_path
            from models_app.routing.link_server import LinkServer

            path = socket_path(settings.DATA_DIR)
            tcp = link_tcp(overrides.advertise, options.get("link_port"))
            self.host.link = LinkServer(self.host.desk, Address("unix", str(path)), tcp)
        self._tasks: list[asyncio.Task[Any]] = []

    def acquire_lock(self) -> None:
        """Take the router's locks; raises ``locks.LockHeld`` naming the owner."""
        self.lock.acquire()

    async def start(self, *extra: Any) -> None:
        """Start the engine (raises what its start raises), then the listener and the keeper.

        ``extra``: more coroutines to run beside them until ``stop`` (embedded mode's jobs).
        """
        from models_app.routing.listener import run_worker

        raise_open_files_limit()
        try:
            await self.host.start()
        except BaseException:
            for coro in extra:  # never to run: close them (no "never awaited" warning)
                coro.close()
            raise
        self._tasks = [
            asyncio.ensure_future(run_worker(self.host.layer, self.host.channel)),
            asyncio.ensure_future(self._keep_lock()),
            *(asyncio.ensure_future(coro) for coro in extra),
        ]

    async def _keep_lock(self) -> None:
        try:
            await self.lock.keep()
        except LockLost as exc:
            log.error("%s; stopping this router", exc)
            self.on_failure(str(exc))

    async def wait(self) -> None:
        """Return when the listener or the lock keeper ended (a failure), else never."""
        await asyncio.wait(self._tasks[:2], return_when=asyncio.FIRST_COMPLETED)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.host.stop()
        finally:
            self.lock.release()


async def reimport_sources(started: runtime.Runtime) -> None:
    """Re-read ``--models-preset``/``--models-dir`` before a reload (GET /models?reload=1)."""
    from asgiref.sync import sync_to_async

    def reimport() -> None:
        if started.models_preset:
            sources.reimport_preset_file(started.models_preset)
        if started.models_dir:
            sources.import_models_dir(started.models_dir)

    await sync_to_async(reimport)()
