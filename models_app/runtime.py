"""Start-up options of this process that the web side reads (set once by ``serve``/``runrouter``).

The web side and the router may live in different processes (team mode), so nothing here is
shared state between them: each process sets its own from its own command line.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field


@dataclass
class RuntimeOptions:
    autoload: bool = True  # --no-models-autoload: the default of ?autoload= (ROUTER_SPEC §8)
    api_keys: list[str] = field(default_factory=list)  # --api-key / LLAMA_API_KEY
    models_preset: str | None = None  # re-imported on GET /models?reload=1
    models_dir: str | None = None
    router: bool = True  # False with --no-router
    server_bin: str | None = None  # --server-bin: what check W001 looks for on PATH


OPTIONS = RuntimeOptions()


def env_default(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``serve`` and ``runrouter`` share, with llama-server's env fallbacks."""
    parser.add_argument(
        "--models-preset",
        metavar="FILE",
        default=env_default("LLAMA_ARG_MODELS_PRESET"),
        help="llama.cpp preset INI, imported at start and re-read by GET /models?reload=1",
    )
    parser.add_argument(
        "--models-dir",
        metavar="DIR",
        default=env_default("LLAMA_ARG_MODELS_DIR"),
        help="every GGUF in DIR becomes a preset",
    )
    parser.add_argument(
        "--models-max",
        type=int,
        metavar="N",
        default=_int_env("LLAMA_ARG_MODELS_MAX"),
        help="max running models, overriding the stored setting (0 = unlimited)",
    )
    parser.add_argument(
        "--server-bin",
        metavar="CMD",
        default=env_default("ROUTERPANEL_SERVER_BIN_OVERRIDE"),
        help="command to run for presets that name no server binary (default: llama-server)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        metavar="SECONDS",
        default=float(env_default("ROUTERPANEL_LEASE_TTL", "30") or 30),
        help="a lease the web side stops renewing expires after this long (30)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="add three simulated models of different sizes (no GPU or model file needed)",
    )


def _int_env(name: str) -> int | None:
    value = env_default(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"{name}={value!r} is not an integer") from None


def split_keys(value: str | None) -> list[str]:
    return [key.strip() for key in (value or "").split(",") if key.strip()]
