"""Turn what the database holds into what the engine runs: ``RouterConfig`` and ``PresetSpec``.

The engine never reads the database (DESIGN §3); the router worker calls these functions at
start, on reload and when settings change, and hands the frozen results over.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from models_app.models import DEFAULT_MAX_WAIT, NodeSettings, Preset, RouterSettings
from models_app.presets.server_options import options_for
from routerpanel.router import options, placement, preflight, presets
from routerpanel.router.config import DEFAULT_LEASE_TTL, PresetSpec, RouterConfig

# Programs known to speak llama-server's child protocol (state lines on stdout, exit on stdin).
# Anything else is polled on /health (S3).
PROTOCOL_PROGRAMS = ("llama-server", "llama")
PROTOCOL_MODULES = ("routerpanel.router.simserver",)


@dataclass(frozen=True)
class Overrides:
    """Command-line overrides from ``serve``/``runrouter``: they win over stored settings."""

    models_max: int | None = None
    max_wait: float | None = None  # --max-wait: wins over the stored setting
    server_bin: str | None = None
    lease_ttl: float = DEFAULT_LEASE_TTL
    queue_policy: str | None = None
    extra_env: tuple[tuple[str, str], ...] = field(default=())
    # Several hosts (issue 18): this router's node name ("" = the single router of team mode or
    # of ``serve``), the address its children listen on and web processes reach them at, and
    # whether each child gets a random per-spawn --api-key (on whenever that address is not
    # loopback).
    node: str = ""
    advertise: str = "127.0.0.1"
    child_keys: bool = False


def router_config(
    row: RouterSettings, overrides: Overrides = Overrides(), node: NodeSettings | None = None
) -> RouterConfig:
    """The engine's config: the command line's overrides win, then the node's own settings
    (several hosts), then the router settings."""

    def pick(name: str) -> Any:
        own = getattr(node, name) if node is not None else None
        return own if own is not None else getattr(row, name)

    models_max = overrides.models_max if overrides.models_max is not None else pick("models_max")
    return RouterConfig(
        models_max=models_max,
        memory_budget=pick("memory_budget") or None,
        memory_headroom=row.memory_headroom,
        settle_timeout=float(pick("settle_timeout")),
        max_waiters=row.max_waiters or None,
        max_wait=overrides.max_wait or float(row.max_wait or DEFAULT_MAX_WAIT),
        quarantine_after=row.quarantine_after,
        default_stop_timeout=float(row.default_stop_timeout),
        lease_ttl=overrides.lease_ttl,
        queue_policy=overrides.queue_policy or row.queue_policy,  # type: ignore[arg-type]
        child_host=overrides.advertise.strip("[]"),
        child_keys=overrides.child_keys,
    )


def speaks_child_protocol(argv: tuple[str, ...]) -> bool:
    """Guess from the command whether the child speaks llama-server's child protocol."""
    program = os.path.basename(argv[0])
    if program in PROTOCOL_PROGRAMS or program.startswith("llama-server"):
        return True
    return any(module in argv for module in PROTOCOL_MODULES)


def preset_specs(
    rows: list[Preset], settings_row: RouterSettings, overrides: Overrides = Overrides()
) -> list[PresetSpec]:
    """Build a spec for every enabled preset, merging ``[*]`` and the stored defaults.

    A router with a node name (``runrouter --node NAME``) gets only the presets eligible on
    that node: those naming no nodes or naming it (issue 18). The single router (node "")
    gets them all."""
    global_def = settings_row.global_def()
    default_bin = overrides.server_bin or settings_row.server_binary
    return [
        _spec(row.to_def(), row, global_def, default_bin, settings_row, overrides)
        for row in rows
        if row.enabled and placement.eligible(row.node_list, overrides.node)
    ]


def sourced(
    name: str, definition: presets.PresetDef, global_def: presets.PresetDef | None, default: object
) -> tuple[object, str]:
    """A field's value for the router and where it comes from: the preset itself ("preset"),
    the ``[*]`` section ("[*]") or the stored settings' default ("default")."""
    own = getattr(definition, name)
    if own is not None:
        return own, "preset"
    inherited = getattr(global_def, name) if global_def is not None else None
    if inherited is not None:
        return inherited, "[*]"
    return default, "default"


def effective(row: Preset, settings_row: RouterSettings) -> dict[str, tuple[object, str]]:
    """The fields a preset may inherit, each as (value the router uses, source); a malformed
    ``[*]`` section (the router refuses it too) counts as absent here."""
    try:
        global_def = settings_row.global_def()
    except ValueError:
        global_def = None
    definition = row.to_def()
    defaults: dict[str, object] = {
        "stop_timeout": settings_row.default_stop_timeout,
        "hang_timeout": settings_row.default_hang_timeout,
        "load_timeout": None,
        "ttl": None,
        "pinned": False,
        "load_on_startup": False,
    }
    return {name: sourced(name, definition, global_def, d) for name, d in defaults.items()}


def _spec(
    definition: presets.PresetDef,
    row: Preset,
    global_def: presets.PresetDef | None,
    default_bin: str,
    settings_row: RouterSettings,
    overrides: Overrides,
) -> PresetSpec:
    def pick(name: str, default: object) -> object:
        return sourced(name, definition, global_def, default)[0]

    program = presets.program_of(definition.server_bin, global_def, default_bin)
    catalogue = options_for(program)
    table = catalogue if isinstance(catalogue, options.OptionTable) else options.builtin()
    argv = presets.render_argv(definition, global_def, default_bin, table)
    env = dict(overrides.extra_env)
    env.update(global_def.env if global_def else ())
    env.update(definition.env)
    ttl = pick("ttl", None)
    load_timeout = pick("load_timeout", None)
    hang_timeout = pick("hang_timeout", settings_row.default_hang_timeout)
    return PresetSpec(
        name=definition.name,
        argv=argv,
        aliases=tuple(a for a in definition.aliases if a != definition.name),
        env=tuple(env.items()),
        stop_timeout=float(pick("stop_timeout", settings_row.default_stop_timeout)),  # type: ignore[arg-type]
        load_timeout=float(load_timeout) if load_timeout else None,  # type: ignore[arg-type]
        hang_timeout=float(hang_timeout) if hang_timeout else None,  # type: ignore[arg-type]
        ttl=float(ttl) if ttl else None,  # type: ignore[arg-type]
        pinned=bool(pick("pinned", False)),
        load_on_startup=bool(pick("load_on_startup", False)),
        memory_estimate=row.memory_estimate or row.gguf_estimate,
        speaks_child_protocol=speaks_child_protocol(argv),
        nodes=definition.nodes,
        problem=unknown_option(definition, global_def, program, catalogue),
        files=preflight.input_files(_file_pairs(definition, global_def)),
    )


def _file_pairs(
    definition: presets.PresetDef, global_def: presets.PresetDef | None
) -> list[tuple[str, str]]:
    """The preset's keys with ``[*]``'s under them, and its model (the child reads each)."""
    merged = dict(global_def.args if global_def else ())
    merged.update(definition.args)
    model = definition.model_path or (global_def.model_path if global_def else "")
    return [("model", model), *merged.items()]


def unknown_option(
    definition: presets.PresetDef,
    global_def: presets.PresetDef | None,
    program: str,
    catalogue: options.Catalogue,
) -> str | None:
    """An option of the preset (or of ``[*]``) that its program's ``--help`` does not list: the
    child would refuse to start, so the router refuses the load before it evicts anyone. The
    keys were checked when stored; this catches a program changed since (a new server-bin)."""
    if not isinstance(catalogue, options.OptionTable):
        return None  # its help could not be read: the keys were accepted unchecked, with a warning
    for key, _ in (*(global_def.args if global_def else ()), *definition.args):
        if catalogue.lookup(key) is None and presets.router_flag(key) is None:
            return (
                f"option '{key}' is not accepted by {program} (its --help does not list it) "
                f"(preset {definition.name})"
            )
    return None


def load_specs(overrides: Overrides = Overrides()) -> tuple[RouterConfig, list[PresetSpec]]:
    """Read the settings row and every preset (sync: call through ``sync_to_async``)."""
    settings_row = RouterSettings.load()
    rows = list(Preset.objects.order_by("name"))
    node = NodeSettings.objects.filter(node=overrides.node).first() if overrides.node else None
    config = router_config(settings_row, overrides, node)
    return config, preset_specs(rows, settings_row, overrides)


def quote_argv(argv: tuple[str, ...]) -> str:
    return shlex.join(argv)
