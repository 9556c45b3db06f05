"""``manage.py runrouter``: the router alone, for team mode (DESIGN §2).

It hosts the engine and the Channels worker for channel ``router`` on the Redis layer, while
``serve --no-router`` processes answer HTTP. Exactly one router may run per host: a lock file
in the system's temporary directory, plus a Redis key per host when Redis is configured,
refuses a second one with a clear message. SIGTERM/SIGINT only set a flag (STYLE 16); the main
coroutine then stops every child within its stop-timeout.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import socket
import tempfile
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_app import bootstrap, runtime, sources, specs
from models_app.management.commands.serve import reimport_sources

LOCK_TTL = 15  # seconds a Redis host lock lives without being refreshed


class RouterLock:
    """Refuse a second router on this host: an flock'ed file, and a Redis key in team mode."""

    def __init__(self, redis_url: str, host: str | None = None) -> None:
        self.host = host or socket.gethostname()
        self.path = Path(tempfile.gettempdir()) / f"routerpanel-router-{os.getuid()}.lock"
        self.redis_url = redis_url
        self.key = f"routerpanel:router-lock:{self.host}"
        self._file: TextIO | None = None

    def acquire(self) -> None:
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise CommandError(
                f"another router is already running on this host ({owner}); "
                "stop it first — one router per host"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        self._file = handle
        if self.redis_url and not self._redis().set(self.key, os.getpid(), nx=True, ex=LOCK_TTL):
            owner = self._redis().get(self.key)
            self.release()
            raise CommandError(
                f"another router is already running for host {self.host} "
                f"(pid {owner.decode() if owner else '?'}, via Redis); one router per host"
            )

    def refresh(self) -> None:
        if self.redis_url:
            self._redis().set(self.key, os.getpid(), ex=LOCK_TTL)

    def release(self) -> None:
        if self.redis_url:
            client = self._redis()
            if client.get(self.key) == str(os.getpid()).encode():
                client.delete(self.key)
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url, socket_timeout=5)


class Command(BaseCommand):
    help = "Run the router alone (team mode): the engine and its Channels worker on Redis."
    requires_system_checks: list[str] = []  # run in handle(), once --server-bin is known (W001)

    def add_arguments(self, parser: CommandParser) -> None:
        runtime.add_router_arguments(parser)
        parser.add_argument("--data-dir", metavar="DIR", help="data directory; read by manage.py")

    def handle(self, *args: Any, **options: Any) -> None:
        runtime.OPTIONS.server_bin = options["server_bin"]
        if not options.get("skip_checks"):
            self.check()
        bootstrap.migrate()
        if not settings.REDIS_URL:
            self.stderr.write(
                "warning: REDIS_URL is not set, so no web process can reach this router; "
                "use `serve` for a single-process setup"
            )
        lock = RouterLock(settings.REDIS_URL)
        lock.acquire()
        try:
            runtime.OPTIONS.models_preset = options["models_preset"]
            runtime.OPTIONS.models_dir = options["models_dir"]
            self._import_sources(options)
            asyncio.run(self._main(options, lock))
        finally:
            lock.release()

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

    async def _main(self, options: dict[str, Any], lock: RouterLock) -> None:
        from channels.layers import get_channel_layer

        from models_app.worker import RouterHost, run_worker

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        overrides = specs.Overrides(
            models_max=options["models_max"],
            server_bin=options["server_bin"],
            lease_ttl=options["lease_ttl"],
        )
        host = RouterHost(
            get_channel_layer(),
            overrides=overrides,
            state_file=settings.DATA_DIR / "children.json",
            before_reload=reimport_sources,
        )
        try:
            await host.start()
        except Exception as exc:
            raise CommandError(f"failed to start the router: {exc}") from None
        worker = asyncio.ensure_future(run_worker(host.layer))
        self.stdout.write(f"router running (pid {os.getpid()}, host {lock.host})")
        self.stdout.flush()
        try:
            while not stop.is_set() and not worker.done():
                try:
                    await asyncio.wait_for(stop.wait(), LOCK_TTL / 3)
                except TimeoutError:
                    await asyncio.to_thread(lock.refresh)
        finally:
            self.stdout.write("router stopping: stopping every child")
            worker.cancel()
            await host.stop()
        if worker.done() and not worker.cancelled() and worker.exception():
            raise CommandError(f"router worker failed: {worker.exception()}")
