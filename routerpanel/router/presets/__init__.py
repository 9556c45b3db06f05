"""Give meaning to the keys of a preset INI: llama-server options, router keys, RouterPanel keys.

``ini.py`` reads the text; this module turns each section into a ``PresetDef`` (and ``[*]`` into
the global one), checks every key the way llama.cpp b11434 does (ROUTER_SPEC §11.C), and turns
definitions back into sections for export. Pure: no Django, no I/O.

Three kinds of keys:

* llama-server options, in any spelling llama.cpp accepts (``c``, ``ctx-size``,
  ``LLAMA_ARG_CTX_SIZE``, ``no-warmup``). The ``alias`` option fills ``aliases`` and the ``model``
  option fills ``model_path``; the others stay in ``args`` as written, in file order.
* llama.cpp's router-only keys: ``load-on-startup``, ``stop-timeout``, ``dedup-cache-models``.
* RouterPanel's keys, which llama.cpp would reject, so ``--llama-compatible`` export leaves them
  out: ``server-bin``, ``pinned``, ``ttl``, ``load-timeout``, ``hang-timeout``, ``memory``,
  ``enabled``, ``node`` (the nodes a model may run on, issue 18; not in ``[*]``) and ``env.NAME``.

llama-server options are checked against the program that will run the preset: its own
``server-bin``, else the one in ``[*]``, else the default. The caller says what each program
accepts (``Resolver``: an ``options.OptionTable`` read from its ``--help``, or
``options.Unreadable`` when that could not be read, in which case keys b11434 does not know are
accepted with a warning). Keys that b11434 does not know are rendered as ``--key value``.

llama.cpp accepts its router's own flags (``models-max``, ``api-key``, …) in a preset file and
silently drops them (ROUTER_SPEC 11.15). RouterPanel drops them too, but warns, naming the line
and where the value belongs, because a ``models-max`` in the file limits nothing.

Modules: ``definition`` (PresetDef, the key families, which program runs a preset), ``parse``
(sections to definitions, every key checked), ``values`` (the router keys' values) and
``render`` (definitions back to INI text and to a child's argv).
"""

from __future__ import annotations

from routerpanel.router.presets.definition import (
    DEFAULT_PROGRAM,
    ENV_PREFIX,
    LLAMA_ROUTER_KEYS,
    RESERVED_KEYS,
    ROUTER_FLAG_HOMES,
    ROUTER_KEY_ENV_NAMES,
    ROUTERPANEL_KEYS,
    ParsedPresets,
    PresetDef,
    Resolver,
    builtin_only,
    program_of,
    router_flag,
)
from routerpanel.router.presets.parse import (
    check_aliases,
    check_option,
    check_value,
    parse_presets,
    section_to_def,
)
from routerpanel.router.presets.render import def_to_section, render_argv, render_presets
from routerpanel.router.presets.status import preset_text
from routerpanel.router.presets.values import (
    check_server_bin,
    format_duration,
    format_nodes,
    format_size,
    parse_bool,
    parse_duration,
    parse_nodes,
    parse_seconds,
    parse_size,
    parse_stop_timeout,
    split_list,
)

__all__ = [
    "DEFAULT_PROGRAM",
    "ENV_PREFIX",
    "LLAMA_ROUTER_KEYS",
    "RESERVED_KEYS",
    "ROUTERPANEL_KEYS",
    "ROUTER_FLAG_HOMES",
    "ROUTER_KEY_ENV_NAMES",
    "ParsedPresets",
    "PresetDef",
    "Resolver",
    "builtin_only",
    "check_aliases",
    "check_option",
    "check_server_bin",
    "check_value",
    "def_to_section",
    "format_duration",
    "format_nodes",
    "format_size",
    "parse_bool",
    "parse_duration",
    "parse_nodes",
    "parse_presets",
    "parse_seconds",
    "parse_size",
    "parse_stop_timeout",
    "preset_text",
    "program_of",
    "render_argv",
    "render_presets",
    "router_flag",
    "section_to_def",
    "split_list",
]  # fmt: skip
