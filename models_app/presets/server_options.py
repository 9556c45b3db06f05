"""Which options a server program accepts, read from its ``--help`` once per binary.

A preset's keys are checked against the program that will run it (``presets.check_option``):
the preset's own ``server-bin``, else the one in ``[*]``, else the default (``serve
--server-bin``, else the stored setting: ``RouterSettings.program_for`` in models/settings.py, which
imports this module and never the reverse). This module runs ``PROGRAM --help`` and hands the text
to the engine's pure parser (``helptext.parse_help``). The answer is cached by the command, the
binary's resolved path and its mtime, so a rebuilt binary is read again and an unchanged one
never is. When the help cannot be read (not on PATH, not executable, a non-zero exit, no option
in the output, no answer within ``HELP_TIMEOUT``) the answer is ``options.Unreadable`` and the
keys b11434 does not know are accepted with a warning instead of being rejected.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from routerpanel.router import helptext, options

log = logging.getLogger(__name__)
T = TypeVar("T")

HELP_TIMEOUT = 20.0
# The child's environment, minus what could change what --help prints or make it act on it.
_SCRUBBED_PREFIXES = ("LLAMA_",)


def options_for(command: str) -> options.Catalogue:
    """Return the options ``command`` accepts, or why they cannot be read."""
    return remembered(f"options {command}", lambda: _options_for(command))


def _options_for(command: str) -> options.Catalogue:
    try:
        argv = _split(command)
    except ValueError as exc:
        return options.Unreadable(command, str(exc))
    if not argv:
        return options.Unreadable(command, "the command is empty")
    path = shutil.which(argv[0])
    if path is None:
        return options.Unreadable(command, f"'{argv[0]}' is not on PATH or not executable")
    real = os.path.realpath(path)
    try:
        mtime = os.stat(real).st_mtime_ns
    except OSError as exc:
        return options.Unreadable(command, exc.strerror or str(exc))
    return _read_help((path, *argv[1:]), command, real, mtime)


@functools.lru_cache(maxsize=256)
def _split(command: str) -> tuple[str, ...]:
    """A command's argv, split as a shell would (an import checks thousands of presets)."""
    return tuple(shlex.split(command))


@functools.lru_cache(maxsize=64)
def _read_help(argv: tuple[str, ...], command: str, real: str, mtime: int) -> options.Catalogue:
    """Run ``argv --help``; ``real`` and ``mtime`` are only part of the cache key."""
    del real, mtime
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    try:
        process = subprocess.Popen(
            [*argv, "--help"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a wrapper's children go with it on a timeout
        )
    except OSError as exc:
        return options.Unreadable(command, f"cannot run it: {exc.strerror or exc}")
    try:
        out, err = process.communicate(timeout=HELP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return options.Unreadable(command, f"'--help' gave no answer in {HELP_TIMEOUT:g} s")
    if process.returncode != 0:
        last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        return options.Unreadable(
            command, f"'--help' exited with status {process.returncode}: {last[0]}"
        )
    text = out.decode("utf-8", "replace")
    table = helptext.parse_help(text, command)
    if table is None:
        return options.Unreadable(command, "its '--help' lists no option")
    log.debug("read %d options from %s --help", len(table.options), command)
    return table


def remembered(key: str, make: Callable[[], T]) -> T:
    """``make()``, or within ``settings_held`` what it gave the first time for ``key``."""
    held = _held.get()
    if held is None:
        return make()
    if key not in held:
        held[key] = make()
    found: T = held[key]
    return found


_held: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("held", default=None)


@contextlib.contextmanager
def settings_held() -> Iterator[None]:
    """Within the block, each preset's program is worked out from the settings once, and each
    program's options are looked up once (an import checks thousands of presets, each one
    against its program's options)."""
    token = _held.set({})
    try:
        yield
    finally:
        _held.reset(token)
