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
  ``enabled`` and ``env.NAME``.

llama-server options are checked against the program that will run the preset: its own
``server-bin``, else the one in ``[*]``, else the default. The caller says what each program
accepts (``Resolver``: an ``options.OptionTable`` read from its ``--help``, or
``options.Unreadable`` when that could not be read, in which case keys b11434 does not know are
accepted with a warning). Keys that b11434 does not know are rendered as ``--key value``.

llama.cpp accepts its router's own flags (``models-max``, ``api-key``, …) in a preset file and
silently drops them (ROUTER_SPEC 11.15). RouterPanel drops them too, but warns, naming the line
and where the value belongs, because a ``models-max`` in the file limits nothing.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from routerpanel.router import ini, options

LLAMA_ROUTER_KEYS = ("load-on-startup", "stop-timeout", "dedup-cache-models")
# llama.cpp also accepts the router keys under these pseudo environment names.
ROUTER_KEY_ENV_NAMES = {
    "__PRESET_LOAD_ON_STARTUP": "load-on-startup",
    "__PRESET_STOP_TIMEOUT": "stop-timeout",
    "__PRESET_DEDUP_CACHE_MODELS": "dedup-cache-models",
}
ROUTERPANEL_KEYS = (
    "server-bin", "pinned", "ttl", "load-timeout", "hang-timeout", "memory", "enabled",
)  # fmt: skip
ENV_PREFIX = "env."
DEFAULT_STOP_TIMEOUT = 10
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
DEFAULT_PROGRAM = "llama-server"
# program (the server-bin command) -> what it accepts
Resolver = Callable[[str], options.Catalogue]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DECIMAL = re.compile(r"\d+(?:\.\d+)?")
_LEADING_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


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


@dataclass
class ParsedPresets:
    global_def: PresetDef | None
    presets: list[PresetDef]
    warnings: list[ini.IniWarning] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)


def builtin_only(default_bin: str = DEFAULT_PROGRAM) -> Resolver:
    """Return a resolver that knows only b11434, for ``default_bin``; other programs' keys go
    unchecked (the engine runs no program; ``models_app.server_options`` reads their --help)."""

    def resolve(program: str) -> options.Catalogue:
        if program == default_bin:
            return options.builtin()
        return options.Unreadable(program, "its options were not read")

    return resolve


def program_of(own: str, global_def: PresetDef | None, default_bin: str) -> str:
    """Return the command that runs a preset: its own server-bin, else ``[*]``'s, else the
    default."""
    return own or (global_def.server_bin if global_def else "") or default_bin


def parse_presets(
    text: str | bytes,
    source: str = "<preset>",
    *,
    default_bin: str = DEFAULT_PROGRAM,
    options_for: Resolver | None = None,
) -> ParsedPresets:
    """Parse and check a whole preset file; raise ``ini.IniError`` naming the first bad line.

    Each section's llama-server options are checked against ``options_for(program)``, the
    program being the section's ``server-bin``, else ``[*]``'s, else ``default_bin``.
    """
    resolve = options_for or builtin_only(default_bin)
    doc = ini.parse(text, source)
    warnings = list(doc.warnings)
    global_section = doc.global_section
    global_def = None
    global_bin = _declared_bin(global_section)
    if global_section is not None:
        catalogue = resolve(global_bin or default_bin)
        global_def = section_to_def(global_section, source, warnings, catalogue)
    presets = []
    for section in doc.model_sections:
        program = _declared_bin(section) or global_bin or default_bin
        presets.append(section_to_def(section, source, warnings, resolve(program)))
    check_aliases(presets, source)
    lines = {s.name: s.line for s in doc.model_sections}
    return ParsedPresets(global_def, presets, warnings, lines)


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
) -> PresetDef:
    """Check each key of ``section`` against ``catalogue`` (default: b11434) into a PresetDef."""
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
            elif key in ROUTERPANEL_KEYS or key in LLAMA_ROUTER_KEYS:
                _router_key(key, value, entry.line, fields, sink)
            else:
                found = check_option(key, section.name, known, entry.line, sink)
                if found is not None and found.key == "alias":
                    aliases = split_list(value)
                elif found is not None and found.key == "model":
                    model_path = value
                else:
                    args.append((key, value))
        except ValueError as exc:
            raise ini.IniError(str(exc), entry.line, source) from None
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
    home = ROUTER_FLAG_HOMES.get(found[0].key)
    if home is not None:
        sink.append(
            ini.IniWarning(
                line,
                f"'{key}'{where} is ignored, as llama.cpp ignores it in a preset file; use {home}",
            )
        )
    return found[0]


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


def parse_stop_timeout(value: str, line: int, warnings: list[ini.IniWarning]) -> int:
    """Read ``stop-timeout`` like C's ``stoi`` (ROUTER_SPEC 2.12), warning where it guesses."""
    match = _LEADING_INT.match(value)
    if match is None:
        warnings.append(ini.IniWarning(line, f"stop-timeout = {value!r} is not a number; using 10"))
        return DEFAULT_STOP_TIMEOUT
    number = int(match.group(1))
    if match.end() != len(value):
        warnings.append(ini.IniWarning(line, f"stop-timeout = {value!r} read as {number}"))
    if number < 0:
        warnings.append(ini.IniWarning(line, f"stop-timeout = {number} means 0 (kill at once)"))
        return 0
    return number


def parse_bool(key: str, value: str) -> bool:
    if options.is_truthy(value):
        return True
    if options.is_falsey(value):
        return False
    raise ValueError(f"{key} = {value!r}: use true or false (also on/off, 1/0)")


def parse_seconds(key: str, value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{key} = {value!r}: expected a whole number of seconds (0 or more)")
    return int(value)


def parse_duration(key: str, value: str) -> float:
    """Read a non-negative number of seconds (``60``, ``2.5``); 0 means "off"."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not math.isfinite(number) or number < 0 or not _DECIMAL.fullmatch(value.strip()):
        raise ValueError(f"{key} = {value!r}: expected a number of seconds (0 or more; 0 = off)")
    return number


def format_duration(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_size(value: str) -> int:
    """Read a byte size such as ``8589934592``, ``8G``, ``512MiB`` or ``1.5GB`` (binary units)."""
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"memory = {value!r}: expected a size such as 8G, 512M or 1073741824")
    return int(float(match.group("number")) * _UNITS[match.group("unit").upper()])


def format_size(size: int) -> str:
    """Write a byte size with the largest binary unit that divides it exactly."""
    for unit in ("T", "G", "M", "K"):
        if size and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


def check_server_bin(value: str) -> str:
    """Check that ``value`` splits like a shell command line; it is never run through a shell."""
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"server-bin = {value!r}: {exc}") from None
    if not words:
        raise ValueError("server-bin is empty")
    return value


def split_list(value: str) -> tuple[str, ...]:
    """Split ``a, b,,c`` into a sorted set, as llama.cpp reads aliases (ROUTER_SPEC 2.7)."""
    return tuple(sorted({part.strip() for part in value.split(",") if part.strip()}))


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


def def_to_section(preset: PresetDef, *, llama_compatible: bool = False) -> ini.Section:
    """Write ``preset`` as a section; ``llama_compatible`` leaves RouterPanel's keys out."""
    section = ini.Section(preset.name, preset.name)
    if preset.model_path:
        section.set("model", preset.model_path)
    if preset.aliases:
        section.set("alias", ",".join(preset.aliases))
    for key, value in preset.args:
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
