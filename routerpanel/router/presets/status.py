"""``status.preset`` of a ``GET /models`` entry: a child's command line as INI text (11.17).

llama.cpp's router renders each entry's options back to the INI dialect it reads: the line
``[<name>]``, then ``<key> = <value>`` per option in the order they are rendered on the command
line (11.16), where ``<key>`` is the option's last spelling without dashes, a flag is ``1`` and
its negative spelling ``0``; a newline inside a value becomes backslash-newline; then an empty
line. The router's own options are left out: ``host``, ``port``, ``alias``, ``tags`` and the
reserved keys. Options that llama-server's table does not know (another program's) are written
the same way, ``--flag value`` as ``flag = value`` and a bare ``--flag`` as ``flag = 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from routerpanel.router import options
from routerpanel.router.presets.definition import RESERVED_KEYS

LEFT_OUT = RESERVED_KEYS | {"host", "port", "alias", "tags"}


@lru_cache(maxsize=16384)  # one per preset's command line: /v1/models renders every entry
def preset_text(name: str, argv: Sequence[str]) -> str:
    """Return ``argv`` (the program first) as llama.cpp's ``status.preset`` text for ``name``."""
    lines = [f"[{name}]"]
    table = options.builtin()
    items = list(argv[1:])
    i = 0
    while i < len(items):
        token = items[i]
        i += 1
        if not token.startswith("-"):
            continue  # a stray value: nothing names it
        found = table.lookup(token.lstrip("-"))
        if found is not None:
            option, negative = found
            key = option.key
            takes_value = option.takes_value
        else:
            key, negative = token.lstrip("-"), False
            takes_value = i < len(items) and not items[i].startswith("-")
        value = "0" if negative else "1"
        if takes_value and i < len(items):
            value = items[i]
            i += 1
        if key not in LEFT_OUT:
            lines.append(f"{key} = {value.replace(chr(10), chr(92) + chr(10))}")
    return "\n".join(lines) + "\n\n"
