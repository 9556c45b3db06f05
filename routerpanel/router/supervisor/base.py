"""The supervisor's base: what it owns (children, log rings, the state file) and how it reports.

``SupervisorBase`` keeps the live children by name, the per-name log rings (kept across
restarts), and the ``post`` callback every report goes through; it writes the state file (S8)
whenever the set of children changes. The layers above read a child's output (output.py), stop
it (stopping.py) and start and reap it (core.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import tempfile
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from routerpanel.router.address import shown
from routerpanel.router.config import DEFAULT_STOP_TIMEOUT
from routerpanel.router.supervisor.child import Child
from routerpanel.router.supervisor.processes import (
    ROUTER_ONLY_ENV,
    child_environment,
    pick_free_port,
)
from routerpanel.router.supervisor.reports import ChildInfo, LogLine, SupervisorEvent
from routerpanel.router.supervisor.statefile import atomic_write

log = logging.getLogger("routerpanel.router.supervisor")  # the package's name, as before the split
STATE_RETRY = 1.0  # seconds between two tries to write a state file that could not be written


class SupervisorBase:
    """Own the children and their logs; post every report through one callback."""

    def __init__(
        self,
        post: Callable[[SupervisorEvent], None],
        *,
        state_file: Path | None,
        log_lines: int = 500,
        health_interval: float = 0.1,
        kill_grace: float = 5.0,
        bind_retries: int = 3,
        strip_env: Collection[str] = (),
        router_port: int = 0,
        port_picker: Callable[[], int] = pick_free_port,
        key_dir: Path | None = None,
    ) -> None:
        self._post_cb = post
        self._state_file = state_file
        self._log_lines = log_lines
        self._health_interval = health_interval
        self._kill_grace = kill_grace
        self._bind_retries = bind_retries
        self._router_port = router_port
        self._pick_port = port_picker
        # Keyed children's key files: beside the state file (the data dir) unless told.
        self._key_dir = key_dir or (state_file.parent if state_file is not None else None)
        # Captured once, like llama.cpp (ROUTER_SPEC 4.6), but filtered (S1, §15.20).
        self._base_env = child_environment(os.environ, (*ROUTER_ONLY_ENV, *strip_env))
        self._children: dict[str, Child] = {}
        self._reserved: set[str] = set()
        self._logs: dict[str, deque[LogLine]] = {}
        self._closed = False
        # Why the state file could not be written (a full disk, a read-only data dir), while
        # it cannot; the write is tried again every STATE_RETRY seconds until it can.
        self.state_problem: str | None = None
        self._state_retry: asyncio.TimerHandle | None = None

    def live(self) -> dict[str, ChildInfo]:
        """Return a snapshot of every child whose exit has not been posted yet."""
        return {c.name: self._info(c) for c in self._live()}

    def logs(self, name: str) -> list[LogLine]:
        """Return the ring buffer of ``name`` (kept after the exit, across restarts)."""
        return list(self._logs.get(name, ()))

    def forget_logs(self, name: str) -> None:
        """Drop the ring buffer of a removed model."""
        self._logs.pop(name, None)

    # ----------------------------------------------------------------- reporting

    def _note(self, name: str, child: Child | None, text: str) -> None:
        self._log(name, child, LogLine(name, "router", text, time.time()))

    def _log(self, name: str, child: Child | None, line: LogLine) -> None:
        self._keep(child, line, name)
        self._post(line)

    def _keep(self, child: Child | None, line: LogLine, name: str | None = None) -> None:
        """Put a line in the ring buffer and the child's last lines, without streaming it."""
        name = name or line.name
        ring = self._logs.get(name)
        if ring is None:
            ring = self._logs[name] = deque(maxlen=self._log_lines)
        ring.append(line)
        if child is not None:
            child.lines.append(line)

    def _post(self, event: SupervisorEvent) -> None:
        try:
            self._post_cb(event)
        except Exception:  # a faulty consumer must not orphan a child
            log.exception("supervisor event consumer failed on %r", event)

    def _info(self, child: Child) -> ChildInfo:
        return ChildInfo(
            name=child.name,
            pid=child.pid,
            port=child.port,
            argv=tuple(shown(child.argv)),
            state=child.state,
            ready=child.ready_at is not None,
            stopping=child.stop_requested_at is not None,
            stop_deadline=child.stop_deadline,
            stuck=child.stuck,
        )

    def _live(self) -> list[Child]:
        return list(self._children.values())

    def _free_port(self) -> int:
        taken = {c.port for c in self._children.values()}
        port = self._pick_port()
        for _ in range(10):
            if port not in taken:
                break
            port = self._pick_port()
        return port

    def _write_key(self, name: str, key: str) -> Path:
        """Write ``key`` to a new file only this user can read; return its path."""
        if self._key_dir is None:  # no data dir: a private temporary one, made once
            self._key_dir = Path(tempfile.mkdtemp(prefix="routerpanel-keys-"))
        self._key_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
        path = self._key_dir / f"child-key-{safe}-{secrets.token_hex(6)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(key + "\n")
        return path

    def remove_stale_keys(self) -> int:
        """Remove the key files a killed router left behind (one router per data dir); return
        how many. A child reads its key when it starts, so no live child needs an old file."""
        if self._key_dir is None or not self._key_dir.is_dir():
            return 0
        live = {c.key_file for c in self._children.values()}
        stale = [p for p in self._key_dir.glob("child-key-*") if p not in live]
        for path in stale:
            self._remove_key(path)
        return len(stale)

    @staticmethod
    def _remove_key(path: Path | None) -> None:
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @staticmethod
    def _timeout_for(name: str, timeout: float | Mapping[str, float]) -> float:
        return (
            timeout.get(name, float(DEFAULT_STOP_TIMEOUT))
            if isinstance(timeout, Mapping)
            else timeout
        )

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _write_state(self) -> None:
        """Rewrite the state file atomically (S8): temp file in the same dir, then replace."""
        if self._state_file is None:
            return
        children = [
            {
                "name": c.name,
                "pid": c.pid,
                "pgid": c.pid,  # start_new_session: the child leads its own group
                "create_time": c.create_time,
                "argv": shown(c.argv),
            }
            for c in self._children.values()
        ]
        data = json.dumps({"version": 1, "router_pid": os.getpid(), "children": children})
        try:
            atomic_write(self._state_file, data)
        except OSError as exc:  # ENOSPC, EIO, EROFS: never lets a child go unwatched
            self._state_failed(exc)
            return
        if self.state_problem is not None:
            self.state_problem = None
            log.warning("the state file %s is written again", self._state_file)

    def _state_failed(self, exc: OSError) -> None:
        """Keep going without the file (S8 is a safety net for the next start, not a condition
        of this one): say so once, and write it again later."""
        problem = f"could not write the state file {self._state_file}: {exc.strerror or exc}"
        if problem != self.state_problem:
            self.state_problem = problem
            log.warning("%s; retrying every %g s", problem, STATE_RETRY)
        if self._state_retry is None or self._state_retry.cancelled():
            with contextlib.suppress(RuntimeError):  # no running loop: the next change retries
                loop = asyncio.get_running_loop()
                self._state_retry = loop.call_later(STATE_RETRY, self._retry_state)

    def _retry_state(self) -> None:
        self._state_retry = None
        self._write_state()
