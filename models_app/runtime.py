"""Start-up options of this process that the web side reads (set once by ``serve``/``runrouter``).

The web side and the router may live in different processes (team mode), so nothing here is
shared state between them: each process sets its own from its own command line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from routerpanel.env import EnvError, envfloat, envint, envstr


@dataclass
class RuntimeOptions:
    autoload: bool = True  # --no-models-autoload: the default of ?autoload= (ROUTER_SPEC §8)
    api_keys: list[str] = field(default_factory=list)  # --api-key / LLAMA_API_KEY
    models_preset: str | None = None  # re-imported on GET /models?reload=1
    models_dir: str | None = None
    router: bool = True  # False with --no-router
    server_bin: str | None = None  # --server-bin: what check W001 looks for on PATH


OPTIONS = RuntimeOptions()


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
        default=envfloat("ROUTERPANEL_LEASE_TTL", 30.0, minimum=1.0),
        help="a lease the web side stops renewing expires after this long (30)",
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
        "or fair (priority class, then least recent use; see README, Fair share)",
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
