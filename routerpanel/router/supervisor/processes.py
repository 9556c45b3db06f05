"""Handle the operating-system side of a child: a free port, a filtered environment (S1), the
exit-watching subprocess protocol (S5), process-group signals and the create time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Collection, Mapping

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs: types-psutil

from routerpanel.router.supervisor.protocol import MAX_LINE_BYTES

# Variables that configure the router itself (DESIGN §8, ROUTER_SPEC §15.20). "X*" = prefix.
ROUTER_ONLY_ENV = (
    "LLAMA_ARG_MODELS_*",
    "LLAMA_API_KEY",
    "LLAMA_ARG_API_KEY*",
    "ROUTERPANEL_*",
    "LLAMA_ARG_HOST",
    "LLAMA_ARG_PORT",
    "LLAMA_SERVER_ROUTER_PORT",
    "LLAMA_SERVER_CHILD_MODE",
)


def pick_free_port(host: str = "127.0.0.1") -> int:
    """Return a port the OS considers free right now (check-then-use, hence S2's retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def child_environment(base: Mapping[str, str], strip: Collection[str]) -> dict[str, str]:
    """Return ``base`` without the names in ``strip`` (a trailing ``*`` makes a prefix)."""
    exact = {p for p in strip if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in strip if p.endswith("*"))
    return {k: v for k, v in base.items() if k not in exact and not k.startswith(prefixes)}


class ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Stream the pipes as usual, and resolve ``exited`` when the leader process exits.

    On Python 3.11 ``Process.wait()`` also waits until every pipe is closed, so a grandchild
    that inherited them would hide the leader's exit; this future (fed by the loop's child
    watcher, not by polling) does not wait for the pipes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=MAX_LINE_BYTES, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


def killpg(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # macOS: a group whose leader is a zombie
        with contextlib.suppress(OSError):
            os.kill(pgid, sig)
    return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_time(pid: int) -> float | None:
    try:
        created: float = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return created
