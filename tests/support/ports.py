"""Ports for the servers a test starts, safe when several pytest workers run at once.

Binding port 0 and closing the socket (the usual trick) leaves a window in which another worker's
``bind(0)``, or any outgoing connection on the machine, can be handed the same port by the kernel.
Here each worker counts through a block of its own below the kernel's ephemeral range (which the
kernel never hands out on its own), so the only process that can take a port between this call
and the server's ``bind`` is the server it was chosen for. A port still held by an earlier test's
server (TIME_WAIT sockets do not count: servers set SO_REUSEADDR) is skipped.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

FIRST = 10_000  # below the usual system ports in use on a developer machine
BLOCK = 2_000  # ports per worker; a full run starts a few hundred servers per worker


def _ephemeral_start() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    return low


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # "gw3" under xdist; "gw0" without
    digits = worker.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def _block() -> range:
    start = FIRST + _worker_index() * BLOCK
    if start + BLOCK > _ephemeral_start():
        raise RuntimeError(
            f"no port block below the ephemeral range for worker {_worker_index()}: "
            "run fewer workers or lower /proc/sys/net/ipv4/ip_local_port_range's start"
        )
    return range(start, start + BLOCK)


_next = itertools.cycle(_block())


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a port no other worker uses and nothing listens on now."""
    for _ in range(BLOCK):
        port = next(_next)
        if _bindable(port):
            return port
    raise RuntimeError(f"every port of this worker's block {_block()} is in use")
