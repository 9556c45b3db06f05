"""Own the state file (S8): write it atomically (``StateWriter``), and at start kill the
children a crashed router left behind (``reap_leftovers``), never a process whose pid was reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs: types-psutil

from routerpanel.router.supervisor.reports import Leftover

log = logging.getLogger("routerpanel.router.supervisor")  # the package's name, as before the split
STATE_RETRY = 1.0  # seconds between two tries to write a state file that could not be written


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def reap_leftovers(state_file: Path, *, wait: float = 5.0) -> list[Leftover]:
    """Kill the children a crashed router left behind, as recorded in ``state_file``.

    A recorded process is killed (SIGKILL to its group) only when it is alive AND its
    create_time matches, so a reused pid is never killed; if the leader is gone, surviving
    members of its group are killed. Blocks up to ``wait`` seconds for them to die (call it
    from a thread in async code). Consumes the file. Returns one ``Leftover`` per record,
    for the audit log.
    """
    found = [_reap_one(entry) for entry in _read_state(state_file)]
    deadline = time.monotonic() + wait
    result = [_await_death(leftover, deadline) for leftover in found]
    with contextlib.suppress(OSError):
        state_file.unlink()
    return result


def _read_state(state_file: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    children = data.get("children") if isinstance(data, dict) else None
    return [c for c in children or [] if isinstance(c, dict) and isinstance(c.get("pid"), int)]


def _reap_one(entry: dict[str, Any]) -> Leftover:
    pid: int = entry["pid"]
    pgid: int = entry["pgid"] if isinstance(entry.get("pgid"), int) else pid
    recorded = entry.get("create_time")
    created = float(recorded) if isinstance(recorded, int | float) else None

    def leftover(outcome: Literal["killed", "gone", "pid_reused"], pids: list[int]) -> Leftover:
        argv = tuple(str(a) for a in entry.get("argv") or ())
        return Leftover(str(entry.get("name", "")), pid, pgid, argv, created, outcome, tuple(pids))

    members = _group_members(pgid, created)
    try:
        actual = psutil.Process(pid).create_time()
    except psutil.Error:
        actual = None
    if actual is not None and (created is None or abs(actual - created) > 0.01):
        return leftover("pid_reused", [])
    if actual is not None and pid not in members:
        members.append(pid)  # it left its group; kill the recorded process itself
    for member in members:
        with contextlib.suppress(OSError):
            os.kill(member, signal.SIGKILL)
    return leftover("killed" if members else "gone", members)


def _group_members(pgid: int, created: float | None) -> list[int]:
    """Pids in group ``pgid`` born no earlier than the recorded leader."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            if created is None or proc.create_time() >= created - 0.01:
                members.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return members


def _await_death(leftover: Leftover, deadline: float) -> Leftover:
    """Wait for killed leftovers to die; zombies count as dead (their parent may be gone)."""
    for pid in leftover.killed_pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # one-off at start-up; these are not our children to await
        if _alive(pid):
            return dataclasses.replace(leftover, outcome="survived")
    return leftover


def _alive(pid: int) -> bool:
    try:
        status: str = psutil.Process(pid).status()
    except psutil.Error:
        return False
    return status != "zombie"  # psutil.STATUS_ZOMBIE


class StateWriter:
    """Rewrite the state file (S8) whenever the set of children changes.

    A write that fails (a full disk, a read-only data dir) never lets a child go unwatched: the
    supervisor goes on without the file (S8 is a safety net for the next start, not a condition
    of this one), ``problem`` says why, and the write is tried again every ``STATE_RETRY``
    seconds until it succeeds.
    """

    def __init__(self, path: Path | None, records: Callable[[], list[dict[str, Any]]]) -> None:
        self._path = path
        self._records = records  # the children as the file lists them
        self.problem: str | None = None
        self._retry: asyncio.TimerHandle | None = None

    def write(self) -> None:
        """Rewrite the state file atomically: temp file in the same dir, then replace."""
        if self._path is None:
            return
        data = json.dumps({"version": 1, "router_pid": os.getpid(), "children": self._records()})
        try:
            atomic_write(self._path, data)
        except OSError as exc:  # ENOSPC, EIO, EROFS: never lets a child go unwatched
            self._failed(exc)
            return
        if self.problem is not None:
            self.problem = None
            log.warning("the state file %s is written again", self._path)

    def _failed(self, exc: OSError) -> None:
        problem = f"could not write the state file {self._path}: {exc.strerror or exc}"
        if problem != self.problem:
            self.problem = problem
            log.warning("%s; retrying every %g s", problem, STATE_RETRY)
        if self._retry is None or self._retry.cancelled():
            with contextlib.suppress(RuntimeError):  # no running loop: the next change retries
                self._retry = asyncio.get_running_loop().call_later(STATE_RETRY, self._again)

    def _again(self) -> None:
        self._retry = None
        self.write()
