"""Write presets back out: an INI section or file (export), and a child's command line."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import replace

from routerpanel.router import ini, options
from routerpanel.router.presets.definition import (
    ENV_PREFIX,
    RESERVED_KEYS,
    PresetDef,
    program_of,
    router_flag,
)
from routerpanel.router.presets.values import format_duration, format_nodes, format_size


def def_to_section(preset: PresetDef, *, llama_compatible: bool = False) -> ini.Section:
    """Write ``preset`` as a section; ``llama_compatible`` leaves RouterPanel's keys out."""
    section = ini.Section(preset.name, preset.name)
    if preset.model_path:
        section.set("model", preset.model_path)
    if preset.aliases:
        section.set("alias", ",".join(preset.aliases))
    for key, value in preset.args:
        if router_flag(key) is None:  # a router flag stored by an older version is not exported
            section.set(key, value)
    if preset.stop_timeout is not None:
        section.set("stop-timeout", str(preset.stop_timeout))
    if preset.load_on_startup is not None:
        section.set("load-on-startup", "true" if preset.load_on_startup else "false")
    if llama_compatible:
        return section
    for key, value in _routerpanel_pairs(preset):
        section.set(key, value)
    return section


def _routerpanel_pairs(preset: PresetDef) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    if preset.server_bin:
        pairs.append(("server-bin", preset.server_bin))
    if preset.pinned is not None:
        pairs.append(("pinned", "true" if preset.pinned else "false"))
    if preset.ttl is not None:
        pairs.append(("ttl", str(preset.ttl)))
    if preset.load_timeout is not None:
        pairs.append(("load-timeout", str(preset.load_timeout)))
    if preset.hang_timeout is not None:
        pairs.append(("hang-timeout", format_duration(preset.hang_timeout)))
    if preset.memory is not None:
        pairs.append(("memory", format_size(preset.memory)))
    if not preset.enabled:
        pairs.append(("enabled", "false"))
    if preset.nodes:
        pairs.append(("node", format_nodes(preset.nodes)))
    pairs.extend((ENV_PREFIX + name, value) for name, value in preset.env)
    return pairs


def render_presets(
    global_def: PresetDef | None,
    presets: Iterable[PresetDef],
    *,
    llama_compatible: bool = False,
    header: str = "",
) -> str:
    """Render a whole preset file; ``parse_presets`` reads it back to the same definitions."""
    doc = ini.IniDocument()
    if global_def is not None:
        section = def_to_section(
            replace(global_def, name=ini.GLOBAL_SECTION), llama_compatible=llama_compatible
        )
        if section.entries:
            doc.sections.append(section)
    for preset in presets:
        if llama_compatible and (preset.server_bin or not preset.enabled):
            continue  # llama.cpp would run llama-server for it, or run a disabled model
        doc.sections.append(def_to_section(preset, llama_compatible=llama_compatible))
    return ini.render(doc, header=header)


def render_argv(
    preset: PresetDef,
    global_def: PresetDef | None,
    default_bin: str,
    table: options.OptionTable | None = None,
) -> tuple[str, ...]:
    """Render the child's command line, without ``--host``/``--port`` (the supervisor adds them).

    Follows ROUTER_SPEC 2.5 and 11.16 with ``table``, the options of the program that runs the
    preset (default: b11434's): ``[*]`` options first, the preset's over them; within a
    section keys apply in sorted byte order, so of two synonyms the one sorting last wins
    (11.11); reserved options are dropped (12.4); ``--alias`` is the model's name so the child
    reports ``id == name``; options are ordered by their first declared spelling and written with
    their last. Keys the table does not know (accepted unchecked) follow as ``--key value``, in
    file order.
    """
    table = table or options.builtin()
    program = program_of(preset.server_bin, global_def, default_bin)
    known: dict[bytes, tuple[options.LlamaOption, str]] = {}
    unknown: dict[str, str] = {}
    for section in (global_def, preset):
        if section is None:
            continue
        for key, value in sorted(section.args, key=lambda pair: pair[0].encode()):
            found = table.lookup(key)
            if router_flag(key) is not None:
                continue  # stored by an older version: never passed on (12.4)
            if found is None:
                unknown.pop(key, None)
                unknown[key] = value
            elif found[0].key not in RESERVED_KEYS:
                option, negative = found
                known[option.sort_key] = (option, options.stored_value(option, negative, value))
    model_path = preset.model_path or (global_def.model_path if global_def else "")
    for key, value in (("model", model_path), ("alias", preset.name), ("log-colors", "off")):
        found = table.lookup(key)
        if found is not None and (value or key != "model"):
            known[found[0].sort_key] = (found[0], value)
    argv = shlex.split(program)
    for sort_key in sorted(known):
        option, value = known[sort_key]
        argv.extend(options.render(option, value))
    unknown_in_file_order = [(k, v) for k, v in _file_order(global_def, preset) if k in unknown]
    for key, value in unknown_in_file_order:
        argv.extend([f"--{key}", value] if value else [f"--{key}"])
    return tuple(argv)


def _file_order(global_def: PresetDef | None, preset: PresetDef) -> list[tuple[str, str]]:
    merged: dict[str, str] = {}
    for section in (global_def, preset):
        for key, value in section.args if section else ():
            merged.pop(key, None)
            merged[key] = value
    return list(merged.items())
