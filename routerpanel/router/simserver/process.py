"""Run the simulated llama-server as a process: parse the command line, log to stderr, install
the signal handlers, bind, serve, and return the exit status.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from routerpanel.router.simserver.app import SimServer
from routerpanel.router.simserver.common import log
from routerpanel.router.simserver.http import SimHTTPServer
from routerpanel.router.simserver.options import HelpRequested, UsageError, parse_args, usage
from routerpanel.router.simserver.protocol import Reporter


def install_signal_handlers(app: SimServer) -> None:
    """SIGTERM and SIGINT exit gracefully, or are logged and ignored with --sim-ignore-sigterm."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if app.opts.ignore_sigterm:
            log.warning("received %s, ignoring it (--sim-ignore-sigterm)", name)
        else:
            app.request_exit(f"received {name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d simserver %(levelname)s: %(message)s", "%H:%M:%S"
        )
    )
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulated llama-server until it is told to exit; return the exit status."""
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
    except HelpRequested:
        print(usage())
        return 0
    except UsageError as exc:
        print(f"{exc}\n\n{usage()}", file=sys.stderr)
        return 1
    reporter = Reporter.from_environment()
    configure_logging()
    for item in opts.ignored:
        log.warning("ignoring unknown llama-server flag: %s", item)
    app = SimServer(opts, reporter)
    try:
        server = SimHTTPServer((opts.host, opts.port), app)
    except OSError as exc:
        log.error(
            "couldn't bind HTTP server socket, hostname: %s, port: %d: %s",
            opts.host,
            opts.port,
            exc,
        )
        return 1
    install_signal_handlers(app)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info(
        "simulated llama-server (no real model) listening on http://%s:%d",
        opts.host,
        server.server_port,
    )
    return app.run()
