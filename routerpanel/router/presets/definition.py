"""What a preset is: ``PresetDef``, the key families and their constants; the program running it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from routerpanel.router import ini, options

LLAMA_ROUTER_KEYS = ("load-on-startup", "stop-timeout", "dedup-cache-models")
# llama.cpp also accepts the router keys under these pseudo environment names.
ROUTER_KEY_ENV_NAMES = {
    "__PRESET_LOAD_ON_STARTUP": "load-on-startup",
    "__PRESET_STOP_TIMEOUT": "stop-timeout",
    "__PRESET_DEDUP_CACHE_MODELS": "dedup-cache-models",
}
ROUTERPANEL_KEYS = (
    "server-bin", "pinned", "ttl", "load-timeout", "hang-timeout", "memory", "enabled", "node",
)  # fmt: skip
ENV_PREFIX = "env."
# Options the router sets or strips itself (ROUTER_SPEC 4.2, 12.4): never rendered from a preset.
RESERVED_KEYS = frozenset(
    {
        "ssl-key-file",
        "ssl-cert-file",
        "api-key",
        "api-key-file",
        "models-dir",
        "models-max",
        "models-preset",
        "models-autoload",
        "host",
        "port",
    }
)

# Router flags that llama.cpp reads in a preset file and then drops (11.15, 12.4): what each
# warning tells the user to use instead.
ROUTER_FLAG_HOMES = {
    "models-max": "serve --models-max N, or max running models in the panel's settings",
    "models-autoload": "serve --no-models-autoload",
    "models-dir": "serve --models-dir DIR",
    "models-preset": "serve --models-preset FILE",
    "api-key": "serve --api-key K, or per-user keys on the panel's API keys page",
    "api-key-file": "serve --api-key K, or per-user keys on the panel's API keys page",
    "ssl-key-file": "a TLS proxy in front of RouterPanel",
    "ssl-cert-file": "a TLS proxy in front of RouterPanel",
    "host": "nothing: the router gives every child its own address",
    "port": "nothing: the router gives every child its own port",
}


def router_flag(key: str) -> str | None:
    """The router flag ``key`` spells (``models-max``, ``LLAMA_ARG_PORT``, ``no-models-autoload``
    …), or None. Looked up in llama-server's own table, whatever program runs the preset: these
    are the router's, and a preset never carries them (llama.cpp drops them, 11.15, 12.4)."""
    found = options.builtin().lookup(key)
    name = found[0].key if found is not None else key.lstrip("-")
    return name if name in ROUTER_FLAG_HOMES else None


DEFAULT_PROGRAM = "llama-server"
# program (the server-bin command) -> what it accepts
Resolver = Callable[[str], options.Catalogue]


@dataclass(frozen=True)
class PresetDef:
    """One model's preset as RouterPanel stores it. ``None`` means "not set here"."""

    name: str
    aliases: tuple[str, ...] = ()
    model_path: str = ""
    args: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    stop_timeout: int | None = None
    load_on_startup: bool | None = None
    pinned: bool | None = None
    ttl: int | None = None
    load_timeout: int | None = None
    hang_timeout: float | None = None  # seconds without progress before the watchdog probes
    memory: int | None = None
    server_bin: str = ""
    enabled: bool = True
    nodes: tuple[str, ...] = ()  # the nodes it may run on (``node = a,b``); empty: any node


@dataclass
class ParsedPresets:
    global_def: PresetDef | None
    presets: list[PresetDef]
    warnings: list[ini.IniWarning] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)
    # the presets whose section names their aliases (an ``alias`` key, even an empty one)
    aliased: frozenset[str] = frozenset()


def builtin_only(default_bin: str = DEFAULT_PROGRAM) -> Resolver:
    """Return a resolver that knows only b11434, for ``default_bin``; other programs' keys go
    unchecked (the engine runs no program; the web side's ``presets.server_options`` reads their
    --help)."""

    def resolve(program: str) -> options.Catalogue:
        if program == default_bin:
            return options.builtin()
        return options.Unreadable(program, "its options were not read")

    return resolve


def program_of(own: str, global_def: PresetDef | None, default_bin: str) -> str:
    """Return the command that runs a preset: its own server-bin, else ``[*]``'s, else the
    default."""
    return own or (global_def.server_bin if global_def else "") or default_bin
