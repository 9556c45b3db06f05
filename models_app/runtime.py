"""This process's start-up options, frozen (docs/architecture.md, "Configuration").

``serve`` and ``runrouter`` build one ``Runtime`` from their command line (``from_options``) and
``start`` it before anything else runs; it never changes afterwards. What can be handed it is:
the API's ``ApiConfig`` (autoload), the router process (the sources to re-read on a reload), the
key store (``--api-key``), the open-API warning. Django's views, models and system checks have
no such way in, so they read ``current()`` — the same frozen value. Without a command (tests,
``manage.py shell``) ``current()`` is the defaults.

The web side and the router may live in different processes (team mode), so nothing here is
shared between them: each process starts its own from its own command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from routerpanel.env import EnvError, envfloat, envint, envstr, split_list
from routerpanel.router.config import DEFAULT_LEASE_TTL


@dataclass(frozen=True)
class Runtime:
    autoload: bool = True  # --no-models-autoload: the default of ?autoload= (ROUTER_SPEC §8)
    api_keys: tuple[str, ...] = ()  # --api-key / LLAMA_API_KEY
    models_preset: str | None = None  # re-imported on GET /models?reload=1
    models_dir: str | None = None
    router: bool = True  # False with --no-router
    server_bin: str | None = None  # --server-bin: what check W001 looks for on PATH

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Runtime:
        """The runtime a command's parsed options describe (serve's and runrouter's flags)."""
        return cls(
            autoload=bool(options.get("autoload", True)),
            api_keys=tuple(split_list(options.get("api_key"))),
            models_preset=options.get("models_preset") or None,
            models_dir=options.get("models_dir") or None,
            router=not options.get("no_router", False),
            server_bin=options.get("server_bin") or None,
        )


_started: Runtime | None = None


def start(runtime: Runtime) -> Runtime:
    """This process's runtime from now on (a command's first step); returns it."""
    global _started
    _started = runtime
    return runtime


def current() -> Runtime:
    """The runtime a command started, else the defaults."""
    return _started or Runtime()


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``serve`` and ``runrouter`` share, with llama-server's env fallbacks."""
    parser.add_argument(
        "--models-preset",
        metavar="FILE",
        default=envstr("LLAMA_ARG_MODELS_PRESET") or None,
        help="llama.cpp preset INI, imported at start and re-read by GET /models?reload=1",
    )
    parser.add_argument(
        "--models-dir",
        metavar="DIR",
        default=envstr("LLAMA_ARG_MODELS_DIR") or None,
        help="every GGUF in DIR becomes a preset",
    )
    parser.add_argument(
        "--models-max",
        type=int,
        metavar="N",
        default=envint("LLAMA_ARG_MODELS_MAX", None, minimum=0),
        help="max running models, overriding the stored setting (0 = unlimited)",
    )
    parser.add_argument(
        "--server-bin",
        metavar="CMD",
        default=envstr("ROUTERPANEL_SERVER_BIN_OVERRIDE") or None,
        help="command to run for presets that name no server binary (default: llama-server)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        metavar="SECONDS",
        default=envfloat("ROUTERPANEL_LEASE_TTL", DEFAULT_LEASE_TTL, minimum=1.0),
        help=f"a lease the web side stops renewing expires after this long ({DEFAULT_LEASE_TTL:g})",
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        metavar="SECONDS",
        default=envint("ROUTERPANEL_MAX_WAIT", None, minimum=1),
        help="longest a request waits in the queue before it is answered 503 with Retry-After, "
        "overriding the stored setting (default 600)",
    )
    parser.add_argument(
        "--queue-policy",
        choices=("fifo", "fair"),
        default=envchoice("ROUTERPANEL_QUEUE_POLICY", ("fifo", "fair")),
        help="order of the queue, overriding the stored setting: fifo (arrival, llama.cpp's) "
        "or fair (priority class, then least recent use; see docs/teams.md, Fair share)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="add three simulated models of different sizes (no GPU or model file needed)",
    )


def envchoice(name: str, choices: tuple[str, ...]) -> str | None:
    """Return the variable's value if it is one of ``choices``, None when unset; else fail."""
    value = envstr(name) or None
    if value is not None and value not in choices:
        raise EnvError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value
