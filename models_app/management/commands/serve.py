"""``manage.py serve``: RouterPanel in one command, flags mirroring llama-server's router.

Embedded mode (the default) is ONE process: Daphne serves HTTP and WebSockets, and the router
worker for channel ``router`` runs in the same event loop on the in-memory channel layer. With
``--no-router`` it is the web side of team mode only, talking to ``runrouter`` over Redis and
over the socket the router advertises (routing/link_client.py; its first lines say which).
``--http uvicorn`` serves the same application with uvicorn instead of Daphne (uvicorn_server.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_app import bootstrap, runtime, security
from models_app.api import auth
from models_app.management.commands import _inputs as inputs
from models_app.models import Preset, RouterSettings
from models_app.presets import sources
from models_app.routing.locks import LockHeld
from models_app.routing.process import RouterProcess, raise_open_files_limit
from routerpanel.env import envbool, envfloat, envint, envstr
from routerpanel.router import states

LISTEN_BACKLOG = 1024  # connections the kernel may hold before Daphne accepts them


class Command(BaseCommand):
    help = "Serve RouterPanel: the llama.cpp-compatible router API, the proxy and the panel."
    requires_system_checks: list[str] = []  # run in handle(), once --server-bin is known (W001)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host",
            default=envstr("LLAMA_ARG_HOST", "127.0.0.1"),
            help="listen address (127.0.0.1)",
        )
        parser.add_argument(
            "--port",
            type=int,
            default=envint("LLAMA_ARG_PORT", 8080, minimum=0),
            help="listen port (8080)",
        )
        runtime.add_router_arguments(parser)
        parser.add_argument(
            "--api-key",
            metavar="K[,K]",
            default=envstr("LLAMA_API_KEY") or None,
            help="API keys clients must send (Bearer or x-api-key)",
        )
        parser.add_argument(
            "--no-models-autoload",
            dest="autoload",
            action="store_false",
            default=envbool("LLAMA_ARG_MODELS_AUTOLOAD", True),
            help="do not start a model for a request unless it asks with ?autoload=true",
        )
        parser.add_argument(
            "--no-router", action="store_true", help="web side only (team mode, with runrouter)"
        )
        parser.add_argument(
            "--data-dir",
            metavar="DIR",
            help="data directory (database, secret key, state file); read by manage.py",
        )
        parser.add_argument(
            "--http",
            choices=("daphne", "uvicorn"),
            default=envstr("ROUTERPANEL_HTTP", "daphne") or "daphne",
            help="the HTTP server: daphne (Channels' own, the default) or uvicorn (faster)",
        )
        parser.add_argument(
            "--shutdown-grace",
            type=float,
            metavar="SECONDS",
            default=envfloat("ROUTERPANEL_SHUTDOWN_GRACE", 5.0, minimum=0.0),
            help="on SIGTERM, the time requests under way get to finish before the router "
            "stops their models and tells them why (5)",
        )
        parser.add_argument("--demo-if-empty", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        started = runtime.start(runtime.Runtime.from_options(options))
        # Every input is checked before anything changes: a bad flag must not leave a created
        # admin (whose one-time password scrolled by) or half the sources imported behind.
        inputs.check_listen_address(options["host"], options["port"])
        if options["shutdown_grace"] < 0:
            raise CommandError("--shutdown-grace must be 0 or more seconds")
        if not options["no_router"]:
            inputs.check_sources(options["models_preset"], options["models_dir"])
        if not options.get("skip_checks"):
            self.check()
        bootstrap.migrate()
        auth.configure(started.api_keys)
        security.warn_if_open(options["host"], started.api_keys, self.stderr)
        if not options["no_router"]:
            self._import_sources(options)
        self._announce_admin()
        self._run(options)

    def _announce_admin(self) -> None:
        password = bootstrap.ensure_admin()
        if password:
            self.stdout.write(
                self.style.WARNING(
                    f"Created user '{bootstrap.ADMIN_USERNAME}' with password: {password}\n"
                    "It is shown only this once; change it in the panel."
                )
            )

    def _import_sources(self, options: dict[str, Any]) -> None:
        """Bring ``--models-preset``, ``--models-dir`` and ``--demo`` into the database."""
        if options["models_preset"]:
            try:
                sources.import_preset_file(options["models_preset"], self.stdout)
            except (OSError, CommandError) as exc:
                raise CommandError(f"failed to initialize router models: {exc}") from None
        if options["models_dir"]:
            try:
                names = sources.import_models_dir(options["models_dir"])
            except sources.SourceError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"models dir: {len(names)} models")
        if options["demo"] or (options["demo_if_empty"] and self._nothing_to_serve(options)):
            names = sources.ensure_demo_presets()
            self.stdout.write(f"demo: serving simulated models {', '.join(names)}")

    def _nothing_to_serve(self, options: dict[str, Any]) -> bool:
        server = options["server_bin"] or RouterSettings.load().server_binary
        if Preset.objects.exists() or shutil.which(server.split()[0]):
            return False
        self.stdout.write(
            "No presets and no llama-server on PATH: adding three simulated demo models. "
            "Add presets in the panel or pass --models-preset FILE."
        )
        return True

    def _run(self, options: dict[str, Any]) -> None:
        host_url = f"http://{inputs.url_host(options['host'])}:{options['port']}/"
        router = None if options["no_router"] else EmbeddedRouter(self, options)
        if router is None:
            raise_open_files_limit()
            from models_app.routing import link_client

            self.stdout.write(link_client.startup_note())
        # The URL only once the socket listens and the router has started: a busy port or a
        # router that refuses to start (too many startup models...) must not look like success.
        ready = Announcement(
            lambda: self.stdout.write(
                f"RouterPanel on {host_url} (the panel; Django admin at {host_url}admin/)"
            ),
            waiting_for={"socket", "router"} if router is not None else {"socket"},
        )
        if router is not None:
            router.on_started = lambda: ready.done("router")
        if options["http"] == "uvicorn":
            failure = self._run_uvicorn(options, router, ready)
        else:
            failure = self._run_daphne(options, router, ready)
        if failure is not None:
            raise CommandError(inputs.listen_error(options["host"], options["port"], failure))
        if router is not None and router.failed:
            sys.exit(1)

    def _run_daphne(
        self, options: dict[str, Any], router: EmbeddedRouter | None, ready: Announcement
    ) -> BaseException | None:
        from daphne.endpoints import build_endpoint_description_strings
        from twisted.internet import error, reactor

        from models_app.servers import daphne_server
        from models_app.servers.daphne_server import RouterPanelServer

        daphne_server.install()
        from routerpanel.asgi import application

        def stop_reactor() -> None:
            with contextlib.suppress(error.ReactorNotRunning):
                # Twisted declares the reactor's methods on zope interfaces, without `self`:
                # lacking the mypy-zope plugin, mypy takes the first argument for it.
                reactor.stop()  # type: ignore[misc]

        if router is not None:
            reactor.callWhenRunning(router.start)
            router.stop_server = stop_reactor
        server = RouterPanelServer(
            application=application,
            # Twisted listens with a backlog of 50: a burst of hundreds of new connections
            # overflows it (uvicorn's is 2048); 1024 fits issue 1's 1,000-request burst.
            endpoints=[
                f"{endpoint}:backlog={LISTEN_BACKLOG}"
                for endpoint in build_endpoint_description_strings(
                    host=options["host"], port=options["port"]
                )
            ],
            signal_handlers=False,  # through the loop, below (routerpanel/reactor.py says why)
            verbosity=0,
            stopping=Stopping(router, options["shutdown_grace"], self.stdout.write),
        )
        server.on_listening = lambda: ready.done("socket")
        loop = reactor._asyncioEventloop
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop_reactor)
        server.run()
        failure: BaseException | None = server.listen_failure
        return failure

    def _run_uvicorn(
        self, options: dict[str, Any], router: EmbeddedRouter | None, ready: Announcement
    ) -> BaseException | None:
        from models_app.servers.uvicorn_server import UvicornServer
        from routerpanel.asgi import application

        server = UvicornServer(
            application, options["host"], options["port"],
            stopping=Stopping(router, options["shutdown_grace"], self.stdout.write),
        )  # fmt: skip
        server.on_listening = lambda: ready.done("socket")
        if router is None:
            server.run()
        else:
            router.stop_server = server.stop
            server.run(on_start=router.start)
        return server.listen_failure


class Stopping:
    """How ``serve`` stops, under either server, once: the same steps on SIGTERM, on a failed
    start and when the router gives up.

    1. The server stops listening (the server does that itself); the API refuses new proxied
       requests (503) and ends the event streams (``Api.drain``).
    2. Requests under way get up to ``grace`` seconds to finish.
    3. The router stops: queued requests get 503 "router is shutting down", every child is
       stopped within its stop-timeout, and a stream still running ends with an SSE error
       event saying so (a non-streamed answer that breaks off: a 503).
    4. The proxy's connections to the children are closed: whatever is left ends.
    """

    def __init__(
        self, router: EmbeddedRouter | None, grace: float, say: Callable[[str], Any] = print
    ) -> None:
        self.router, self.grace, self.say = router, grace, say
        self._done: asyncio.Future[None] | None = None

    def __call__(self) -> asyncio.Future[None]:
        if self._done is None:
            self._done = asyncio.ensure_future(self._stop())
        return self._done

    async def _stop(self) -> None:
        from routerpanel.asgi import http_app

        self.say(self._plan())
        await http_app.drain(self.grace)
        if self.router is not None:
            await self.router.stop()
        await http_app.aclose()
        self.say("Stopped.")

    def _plan(self) -> str:
        """What Ctrl-C (or SIGTERM) stops, said before it is done (issue 49.10)."""
        steps = [f"no new requests; those under way get up to {self.grace:g} s to finish"]
        if self.router is not None:
            running = self.router.running()
            steps.append(
                f"then the router stops {', '.join(running)}, each within its stop-timeout"
                if running else "then the router (no model runs)"
            )  # fmt: skip
        return f"Stopping RouterPanel: {'; '.join(steps)}."


class Announcement:
    """Say something once, when every part it waits for is done."""

    def __init__(self, say: Callable[[], None], *, waiting_for: set[str]) -> None:
        self._say, self._left = say, set(waiting_for)

    def done(self, part: str) -> None:
        if part in self._left:
            self._left.discard(part)
            if not self._left:
                self._say()


class EmbeddedRouter:
    """Start the router inside Daphne's event loop and stop it before the loop ends."""

    def __init__(self, command: Command, options: dict[str, Any]) -> None:
        self.command = command
        self.failed = False
        self.process = RouterProcess(options, on_failure=self._fail)
        try:
            self.process.acquire_lock()  # before Daphne listens: a twin is refused at once
        except LockHeld as exc:
            raise CommandError(str(exc)) from None
        self._start_task: asyncio.Future[None] | None = None
        self.on_started: Callable[[], None] = lambda: None
        self.stop_server: Callable[[], None] = lambda: None  # set by the server that runs it

    def start(self) -> None:
        self._start_task = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        # No celery beat runs in embedded mode: run the periodic jobs in this loop instead.
        from models_app.embedded_beat import EmbeddedBeat

        try:
            await self.process.start(EmbeddedBeat().run())
        except Exception as exc:
            self._fail(f"failed to start the router: {exc}")
        else:
            self.on_started()

    def _fail(self, reason: str) -> None:
        self.failed = True
        self.command.stderr.write(reason)
        self.stop_server()

    def stop(self) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self.process.stop())

    def running(self) -> list[str]:
        """The models whose child runs now, by name."""
        engine = self.process.host.engine
        models = engine.snapshot().get("models") or () if engine is not None else ()
        return sorted(m["name"] for m in models if m.get("state") in states.RUNNING)
