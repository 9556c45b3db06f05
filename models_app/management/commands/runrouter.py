"""``manage.py runrouter``: the router alone, for team mode (DESIGN §2).

It hosts the engine and the Channels worker for channel ``router`` on the Redis layer, and
listens on a Unix socket in its data dir for the web processes' data path (routing/link_server.py),
and on TCP for web processes on other hosts (``--link-port``; by default when ``--advertise`` is not
loopback), while ``serve --no-router`` processes answer HTTP. One router per data dir and per
installation: ``locks.RouterLock`` refuses a second one with a message naming the first, and
takes over at once from one that was killed (``kill -9``). It outlives Redis: the listener, the
heartbeat and the lock refresh retry until Redis is back, and the children keep running
meanwhile. SIGTERM and SIGINT only set a flag (STYLE 16); the main coroutine then stops every
child within its stop-timeout. It exits non-zero when it cannot go on (another router took the
installation).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Coroutine
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_app import bootstrap, runtime
from models_app.presets import sources
from models_app.routing import topology
from models_app.routing.locks import LockHeld
from models_app.routing.process import RouterProcess


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the router on uvloop, the loop ``serve`` runs on under either server: a tenth less of
    the router's CPU per request in team mode (two messages in and one out, each a loop turn).
    ``ROUTERPANEL_ROUTER_LOOP=asyncio`` keeps the stock asyncio loop (to compare, or to rule
    uvloop out)."""
    if os.environ.get("ROUTERPANEL_ROUTER_LOOP") == "asyncio":
        asyncio.run(main)
        return
    import uvloop

    uvloop.run(main)


class Command(BaseCommand):
    help = "Run the router alone (team mode): the engine and its Channels worker on Redis."
    requires_system_checks: list[str] = []  # run in handle(), once --server-bin is known (W001)

    def add_arguments(self, parser: CommandParser) -> None:
        runtime.add_router_arguments(parser)
        parser.add_argument("--data-dir", metavar="DIR", help="data directory; read by manage.py")
        parser.add_argument(
            "--node",
            metavar="NAME",
            default=settings.ROUTERPANEL_NODE or None,
            type=node_name,
            help="run as node NAME of several hosts (docs/team-deployment.md); default: the "
            "single router of this installation",
        )
        parser.add_argument(
            "--advertise",
            metavar="ADDR",
            default=settings.ROUTERPANEL_ADVERTISE or "127.0.0.1",
            help="the address children listen on and web processes reach them at (127.0.0.1)",
        )
        parser.add_argument(
            "--link-port",
            metavar="PORT",
            type=int,
            default=settings.ROUTERPANEL_LINK_PORT,
            help="TCP port of the data path for web processes on other hosts (0: any free "
            "port); default: any free port when --advertise is not loopback, else none",
        )
        parser.add_argument(
            "--child-keys",
            choices=("auto", "on", "off"),
            default=settings.ROUTERPANEL_CHILD_KEYS or "auto",
            help="give each child a random per-spawn --api-key (auto: when --advertise is "
            "not a loopback address)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        runtime.start(runtime.Runtime.from_options(options))
        if not options.get("skip_checks"):
            self.check()
        bootstrap.migrate()
        if not settings.REDIS_URL:
            self.stderr.write(
                "warning: REDIS_URL is not set, so no web process can reach this router; "
                "use `serve` for a single-process setup"
            )
        self.failure: str | None = None
        router = RouterProcess(options, on_failure=self._failed, link=True)
        try:
            router.acquire_lock()
        except LockHeld as exc:
            raise CommandError(str(exc)) from None
        if router.lock.took_over is not None:
            self.stdout.write(f"replaced a dead router ({router.lock.took_over.describe()})")
        try:
            self._import_sources(options)
        except BaseException:
            router.lock.release()
            raise
        run_loop(self._main(router))
        if self.failure is not None:
            raise CommandError(self.failure)

    def _failed(self, reason: str) -> None:
        self.failure = reason
        self._stop.set()

    def _import_sources(self, options: dict[str, Any]) -> None:
        if options["models_preset"]:
            sources.import_preset_file(options["models_preset"], self.stdout)
        if options["models_dir"]:
            try:
                sources.import_models_dir(options["models_dir"])
            except sources.SourceError as exc:
                raise CommandError(str(exc)) from None
        if options["demo"]:
            sources.ensure_demo_presets()

    async def _main(self, router: RouterProcess) -> None:
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        try:
            await router.start()
        except Exception as exc:
            router.lock.release()
            raise CommandError(f"failed to start the router: {exc}") from None
        link = router.host.link
        paths = []
        if link is not None and link.listening:
            paths.append(str(link.address))
        if link is not None and link.tcp_link:
            paths.append(link.tcp_link)
        where = " and ".join(paths) or "channel layer only"
        overrides = router.host.overrides
        node = (
            f"node {overrides.node}, children on {overrides.advertise}"
            + (" with per-spawn keys" if overrides.child_keys else "")
            + "; "
            if overrides.node
            else ""
        )
        self.stdout.write(
            f"router running ({node}pid {os.getpid()}, boot {router.boot}; data path: {where})"
        )
        self.stdout.flush()
        failed = asyncio.ensure_future(router.wait())
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({failed, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            stopping.cancel()
            self.stdout.write("router stopping: stopping every child")
            self.stdout.flush()
            await router.stop()


def node_name(value: str) -> str:
    """argparse's check of ``--node``: a name that can be a channel's and a Redis key's."""
    try:
        return topology.check_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
