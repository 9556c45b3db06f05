"""Check what can be checked before a model takes anyone's slot: the program and its files.

A load that can never succeed must not evict a healthy model first (on a shared machine that
throws a large model out of memory for nothing). Before a request or a load for a model that is
not running joins the queue, the engine asks ``check``: is the program there and executable (on
the child's own ``PATH`` when it is given by name), and is every input file of the preset
(``spec.files``: its model, ``mmproj``, ``model-draft``, ``lora``, …, which the adapter lists
from the preset's keys) there and readable? A problem the adapter found when it built the spec
(an option the program does not accept) comes first.
The answer names the missing thing and the preset: ``llama-server not found:
/opt/llama/bin/llama-server (preset qwen2.5-7b)``.

A few ``stat`` calls, no process is started: cheap enough to ask on every such request.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterable

from routerpanel.router import options
from routerpanel.router.config import PresetSpec

# llama-server options whose value is a file the child reads at start (their table keys).
INPUT_FILES = frozenset(
    {"model", "mmproj", "model-draft", "lora", "control-vector", "grammar-file", "json-schema-file"}
)

Preflight = Callable[[PresetSpec], "str | None"]


def check(spec: PresetSpec) -> str | None:
    """Return why ``spec`` cannot start, naming the missing thing, or None when it may."""
    if spec.problem:
        return spec.problem
    where = f"(preset {spec.name})"
    if problem := _program_problem(spec):
        return f"{problem} {where}"
    for key, path in spec.files:
        if problem := _file_problem(key, path):
            return f"{problem} {where}"
    return None


def never(spec: PresetSpec) -> str | None:
    """A preflight that finds nothing (engine tests, whose presets name no real files)."""
    return None


def input_files(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The (option key, path) of each input file among a preset's ``(key, value)`` pairs: the
    keys llama-server's table names ``model``, ``mmproj``, ... in any spelling."""
    table = options.builtin()
    found: list[tuple[str, str]] = []
    for key, value in pairs:
        option = table.lookup(key.lstrip("-"))
        if option is not None and option[0].key in INPUT_FILES and value:
            found.append((option[0].key, value))
    return tuple(found)


def _program_problem(spec: PresetSpec) -> str | None:
    program = spec.argv[0]
    name = os.path.basename(program)
    if os.sep not in program:
        path = dict(spec.env).get("PATH", os.environ.get("PATH", os.defpath))
        if shutil.which(program, path=path) is None:
            return f"{name} not found on PATH"
        return None
    if not os.path.exists(program):
        return f"{name} not found: {program}"
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        return f"{name} is not an executable file: {program}"
    return None


def _file_problem(key: str, path: str) -> str | None:
    what = "model file" if key == "model" else f"{key} file"
    if not os.path.exists(path):
        return f"{what} not found: {path}"
    if os.path.isdir(path):
        return f"{what} is a directory: {path}"
    if not os.access(path, os.R_OK):
        return f"{what} is not readable: {path}"
    return None


class Checks:
    """What the engine knows of which models cannot start: the latest answer per model, from
    a check at start and reload (``check_all``) and before each load (``check``). Owned by the
    engine's loop; ``check_all`` does its stat calls in a thread."""

    def __init__(self, preflight: Preflight = check) -> None:
        self._preflight = preflight
        self._why: dict[str, str] = {}  # model -> why it cannot start, from its latest check

    def check(self, spec: PresetSpec) -> str | None:
        """Check ``spec`` now; remember and return why it cannot start, or None."""
        problem = self._preflight(spec)
        if problem is None:
            self._why.pop(spec.name, None)
        else:
            self._why[spec.name] = problem
        return problem

    async def check_all(self, specs: Iterable[PresetSpec]) -> None:
        """Check every preset (a few stat calls each, off the loop): the card of a model that
        cannot start says so before anyone asks for it."""
        listed = list(specs)
        found = await asyncio.to_thread(lambda: {s.name: self._preflight(s) for s in listed})
        self._why = {name: why for name, why in found.items() if why is not None}

    def why(self, name: str) -> str | None:
        return self._why.get(name)
