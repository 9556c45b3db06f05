"""``manage.py routerstatus``: is the router alive? For health checks and supervisors.

Team mode: reads the router's heartbeat from Redis (liveness.py). The beat is written by the
router's own event loop every second, so a fresh one proves the process runs *and* serves; a
lock file or a pid proves neither. ``--this-host`` also requires the beating router to be a live
process on this host (a container's health check). Exit status 0: alive; 1: not; 2: cannot tell
(no REDIS_URL, Redis unreachable). Prints one line either way.

Several hosts (issue 18): ``--node NAME`` asks about that node's router; ``--nodes`` prints one
line per node of the installation (live or lost) and exits 0 when every node is live.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import psutil
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from models_app.routing import liveness, nodes


class Command(BaseCommand):
    help = "Exit 0 if the router's heartbeat is fresh (team mode), 1 if not, 2 if unknown."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--this-host", action="store_true", help="the router must run on this host"
        )
        parser.add_argument(
            "--max-age", type=float, default=liveness.DEAD_AFTER,
            help=f"seconds a heartbeat stays fresh ({liveness.DEAD_AFTER:g})",
        )  # fmt: skip
        parser.add_argument(
            "--node", default="", metavar="NAME", help="the router of node NAME (several hosts)"
        )
        parser.add_argument(
            "--nodes", action="store_true", help="every node of the installation, one a line"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.REDIS_URL:
            self.stdout.write("unknown: REDIS_URL is not set (embedded mode: use GET /ready)")
            raise SystemExit(2)
        if options["nodes"]:
            self._nodes(options["max_age"])
            return
        try:
            beat = asyncio.run(_read(options["node"]))
        except Exception as exc:
            self.stdout.write(f"unknown: Redis unreachable ({exc})")
            raise SystemExit(2) from None
        age = None if beat is None else time.time() - beat.time
        who = f"node {options['node']}" if options["node"] else "the router"
        if beat is None or age is None or age > options["max_age"]:
            self.stdout.write(f"down: no fresh heartbeat from {who}")
            raise SystemExit(1)
        if options["this_host"] and not _here_and_alive(beat):
            self.stdout.write(f"down: the beating router is pid {beat.pid} on {beat.host}")
            raise SystemExit(1)
        self.stdout.write(
            f"up: router pid {beat.pid} on {beat.host}, boot {beat.boot}, beat {age:.1f} s ago"
        )

    def _nodes(self, max_age: float) -> None:
        try:
            found = asyncio.run(_directory(max_age))
        except Exception as exc:
            self.stdout.write(f"unknown: Redis unreachable ({exc})")
            raise SystemExit(2) from None
        if not found:
            self.stdout.write("no nodes: this installation runs one unnamed router")
            raise SystemExit(1)
        for node in found:
            row = node.as_json()
            age = "never" if row["beat_age"] is None else f"{row['beat_age']:.1f} s ago"
            self.stdout.write(
                f"{row['state']}: node {node.name} pid {node.pid} on {node.host or '?'}, "
                f"children on {node.advertise or '?'}, {row['running'] or 0} of "
                f"{row['models_max'] or 'unlimited'} running, beat {age}"
            )
        if not all(node.live for node in found):
            raise SystemExit(1)


async def _read(node: str = "") -> liveness.Beat | None:
    client = liveness.redis_client()
    try:
        return liveness.Beat.parse(await client.get(liveness.heartbeat_key(node)))
    finally:
        await client.aclose()


async def _directory(max_age: float) -> list[nodes.Node]:
    client = liveness.redis_client()
    try:
        return await nodes.directory(client, dead_after=max_age)
    finally:
        await client.aclose()


def _here_and_alive(beat: liveness.Beat) -> bool:
    if beat.host != socket.gethostname():
        return False
    try:
        return psutil.Process(beat.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
