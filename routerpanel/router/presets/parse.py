"""Turn the sections of a preset INI into ``PresetDef``s, checking every key (ROUTER_SPEC §11.C)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from routerpanel.router import ini, options
from routerpanel.router.presets.definition import (
    DEFAULT_PROGRAM,
    ENV_PREFIX,
    LLAMA_ROUTER_KEYS,
    ROUTER_FLAG_HOMES,
    ROUTER_KEY_ENV_NAMES,
    ROUTERPANEL_KEYS,
    ParsedPresets,
    PresetDef,
    Resolver,
    builtin_only,
    router_flag,
)
from routerpanel.router.presets.values import (
    check_server_bin,
    parse_bool,
    parse_duration,
    parse_nodes,
    parse_seconds,
    parse_size,
    parse_stop_timeout,
    split_list,
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_presets(
    text: str | bytes,
    source: str = "<preset>",
    *,
    default_bin: str = DEFAULT_PROGRAM,
    options_for: Resolver | None = None,
) -> ParsedPresets:
    """Parse and check a whole preset file; raise ``ini.IniError`` naming the bad line, or
    ``ini.IniErrors`` naming every bad line when there are several.

    Each section's llama-server options are checked against ``options_for(program)``, the
    program being the section's ``server-bin``, else ``[*]``'s, else ``default_bin``.
    """
    resolve = options_for or builtin_only(default_bin)
    errors: list[ini.IniError] = []  # every bad line, syntax and meaning, reported at once
    doc = ini.parse(text, source, errors)
    warnings = list(doc.warnings)
    global_section = doc.global_section
    global_def = None
    global_bin = _declared_bin(global_section)
    if global_section is not None:
        catalogue = resolve(global_bin or default_bin)
        global_def = section_to_def(global_section, source, warnings, catalogue, errors)
    presets, aliased = [], set()
    for section in doc.model_sections:
        program = _declared_bin(section) or global_bin or default_bin
        presets.append(section_to_def(section, source, warnings, resolve(program), errors))
        if _names_aliases(section):
            aliased.add(section.name)
    ini.raise_all(errors, warnings)
    check_aliases(presets, source)
    lines = {s.name: s.line for s in doc.model_sections}
    return ParsedPresets(global_def, presets, warnings, lines, frozenset(aliased))


def _names_aliases(section: ini.Section) -> bool:
    """Whether the section has an ``alias`` key (any of llama-server's spellings of it)."""
    table = options.builtin()
    for entry in section.entries:
        found = table.lookup(entry.key)
        if found is not None and found[0].key == "alias":
            return True
    return False


def _declared_bin(section: ini.Section | None) -> str:
    """Return the section's server-bin if it is usable (section_to_def reports it otherwise)."""
    value = section.get("server-bin") if section is not None else None
    try:
        return check_server_bin(value) if value is not None else ""
    except ValueError:
        return ""


def section_to_def(
    section: ini.Section,
    source: str,
    warnings: list[ini.IniWarning] | None = None,
    catalogue: options.Catalogue | None = None,
    errors: list[ini.IniError] | None = None,
) -> PresetDef:
    """Check each key of ``section`` against ``catalogue`` (default: b11434) into a PresetDef.

    A bad key raises ``ini.IniError``; with ``errors`` given, each bad key is added to it
    instead and the rest of the section is still checked."""
    sink = warnings if warnings is not None else []
    known = catalogue or options.builtin()
    fields: dict[str, object] = {}
    args: list[tuple[str, str]] = []
    env: list[tuple[str, str]] = []
    aliases: tuple[str, ...] = ()
    model_path = ""
    for entry in section.entries:
        key, value = ROUTER_KEY_ENV_NAMES.get(entry.key, entry.key), entry.value
        try:
            if key.startswith(ENV_PREFIX):
                env.append((_env_name(key), value))
            elif key == "node" and section.name == ini.GLOBAL_SECTION:
                raise ValueError(
                    f"node = {value!r} in [*]: name the nodes in each model's section "
                    "(a model without node runs on any node)"
                )
            elif key in ROUTERPANEL_KEYS or key in LLAMA_ROUTER_KEYS:
                _router_key(key, value, entry.line, fields, sink)
            elif (flag := router_flag(key)) is not None:  # warned and dropped, never stored
                where = f" in preset '{section.name}'" if section.name else ""
                home = ROUTER_FLAG_HOMES[flag]
                message = f"'{key}'{where} is ignored, as llama.cpp ignores it in a preset file"
                sink.append(ini.IniWarning(entry.line, f"{message}; use {home}"))
            else:
                found = check_option(key, section.name, known, entry.line, sink)
                if found is not None and found.key == "alias":
                    aliases = split_list(value)
                elif found is not None and found.key == "model":
                    model_path = value
                else:
                    check_value(found, key, value, section.name)
                    args.append((key, value))
        except ValueError as exc:
            if errors is None:
                raise ini.IniError(str(exc), entry.line, source) from None
            errors.append(ini.IniError(str(exc), entry.line, source))
    return PresetDef(
        name=section.name,
        aliases=aliases,
        model_path=model_path,
        args=tuple(args),
        env=tuple(env),
        **fields,  # type: ignore[arg-type]
    )


def check_option(
    key: str,
    preset: str,
    catalogue: options.Catalogue,
    line: int = 0,
    warnings: list[ini.IniWarning] | None = None,
) -> options.LlamaOption | None:
    """Return the option ``key`` names for the program of ``preset``; raise ValueError if that
    program does not accept it. Warn (into ``warnings``) when the key goes unchecked because
    the program's options could not be read, and when llama.cpp would silently drop it."""
    sink = warnings if warnings is not None else []
    table = catalogue if isinstance(catalogue, options.OptionTable) else options.builtin()
    found = table.lookup(key)
    where = f" in preset '{preset}'" if preset else ""
    if found is None and isinstance(catalogue, options.OptionTable):
        message = f"option '{key}' not recognized{where}"
        if catalogue is not options.builtin():
            message += f" ('{catalogue.origin} --help' does not list it)"
        raise ValueError(message)
    if found is None:
        assert isinstance(catalogue, options.Unreadable)
        sink.append(
            ini.IniWarning(
                line,
                f"option '{key}'{where} is not checked: the options of "
                f"'{catalogue.program}' could not be read ({catalogue.reason})",
            )
        )
        return None
    return found[0]


def check_value(found: options.LlamaOption | None, key: str, value: str, preset: str = "") -> None:
    """Raise ValueError when ``value`` is not of the option's type (its handler and value hint
    in llama-server's table): ``n-gpu-layers = lots`` is refused, not passed to the child."""
    if found is None:
        return
    problem = options.value_problem(found, value)
    if problem:
        where = f" in preset '{preset}'" if preset else ""
        raise ValueError(f"{key} = {value!r}{where}: {found.key} {problem}")


def _env_name(key: str) -> str:
    name = key[len(ENV_PREFIX) :]
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"'{key}': environment variable names use letters, digits and '_'")
    return name


def _router_key(
    key: str, value: str, line: int, fields: dict[str, object], warnings: list[ini.IniWarning]
) -> None:
    if key == "stop-timeout":
        fields["stop_timeout"] = parse_stop_timeout(value, line, warnings)
    elif key == "load-on-startup":
        if not (options.is_truthy(value) or options.is_falsey(value)):
            warnings.append(ini.IniWarning(line, f"load-on-startup = {value!r} counts as false"))
        fields["load_on_startup"] = options.is_truthy(value)
    elif key == "dedup-cache-models":
        warnings.append(ini.IniWarning(line, "dedup-cache-models has no effect in RouterPanel"))
    elif key == "server-bin":
        fields["server_bin"] = check_server_bin(value)
    elif key in ("pinned", "enabled"):
        fields[key] = parse_bool(key, value)
    elif key in ("ttl", "load-timeout"):
        fields[key.replace("-", "_")] = parse_seconds(key, value)
    elif key == "hang-timeout":
        fields["hang_timeout"] = parse_duration(key, value)
    elif key == "memory":
        fields["memory"] = parse_size(value)
    elif key == "node":
        fields["nodes"] = parse_nodes(value)


def check_aliases(presets: Iterable[PresetDef], source: str = "<preset>") -> None:
    """Reject names and aliases that collide, with llama.cpp's messages (ROUTER_SPEC 2.9)."""
    ordered = sorted(presets, key=lambda p: p.name.encode())
    names = {p.name for p in ordered}
    owner: dict[str, str] = {}
    for preset in ordered:
        if preset.name in owner:
            raise ini.IniError(
                f"model name '{preset.name}' conflicts with alias of model '{owner[preset.name]}'",
                source=source,
            )
        for alias in preset.aliases:
            if alias in names and alias != preset.name:
                raise ini.IniError(
                    f"alias '{alias}' for model '{preset.name}' conflicts with existing model name",
                    source=source,
                )
            if alias in owner and owner[alias] != preset.name:
                raise ini.IniError(
                    f"alias '{alias}' for model '{preset.name}' conflicts with alias of "
                    f"model '{owner[alias]}'",
                    source=source,
                )
            owner[alias] = preset.name
