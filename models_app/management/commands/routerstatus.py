"""``manage.py routerstatus``: is the router alive? For health checks and supervisors.

Team mode: reads the router's heartbeat from Redis (liveness.py). The beat is written by the
router's own event loop every second, so a fresh one proves the process runs *and* serves; a
lock file or a pid proves neither. ``--this-host`` also requires the beating router to be a live
process on this host (a container's health check). Exit status 0: alive; 1: not; 2: cannot tell
(no REDIS_URL, Redis unreachable). Prints one line either way.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import psutil
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from models_app import liveness


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

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.REDIS_URL:
            self.stdout.write("unknown: REDIS_URL is not set (embedded mode: use GET /ready)")
            raise SystemExit(2)
        try:
            beat = asyncio.run(_read())
        except Exception as exc:
            self.stdout.write(f"unknown: Redis unreachable ({exc})")
            raise SystemExit(2) from None
        age = None if beat is None else time.time() - beat.time
        if beat is None or age is None or age > options["max_age"]:
            self.stdout.write("down: no fresh heartbeat from the router")
            raise SystemExit(1)
        if options["this_host"] and not _here_and_alive(beat):
            self.stdout.write(f"down: the beating router is pid {beat.pid} on {beat.host}")
            raise SystemExit(1)
        self.stdout.write(
            f"up: router pid {beat.pid} on {beat.host}, boot {beat.boot}, beat {age:.1f} s ago"
        )


async def _read() -> liveness.Beat | None:
    client = liveness.redis_client()
    try:
        return liveness.Beat.parse(await client.get(liveness.heartbeat_key()))
    finally:
        await client.aclose()


def _here_and_alive(beat: liveness.Beat) -> bool:
    if beat.host != socket.gethostname():
        return False
    try:
        return psutil.Process(beat.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
