"""Run the periodic jobs inside ``serve`` in embedded mode, where no ``celery beat`` runs.

Team mode has a real beat (django-celery-beat's database scheduler). Embedded mode is one
process with Celery eager, so this small loop does beat's job there: every ``interval`` it
asks each schedule — the fixed ones in ``CELERY_BEAT_SCHEDULE`` and the admins' enabled
``PeriodicTask`` rows (scheduled preloads) — whether it is due, and runs the due tasks inline,
off the event loop. Same tasks, same functions; only the clock that triggers them differs.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

log = logging.getLogger(__name__)


CHECK_EVERY = 15.0  # seconds between checks, unless a fixed schedule is shorter


class EmbeddedBeat:
    def __init__(self, interval: float | None = None) -> None:
        self.interval = interval if interval is not None else shortest_interval()
        self._last_run: dict[str, datetime] = {}

    async def run(self) -> None:
        """Check the schedules until cancelled; a failing job is logged, never fatal."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await sync_to_async(self.run_due)()
            except Exception:
                log.exception("periodic jobs failed")

    def run_due(self, now: datetime | None = None) -> list[str]:
        """Run every due job once; return their names."""
        from celery import current_app

        now = now or timezone.now()
        ran = []
        for name, task, args, schedule in self._schedules():
            last = self._last_run.setdefault(name, now)
            due, _ = schedule.is_due(last)
            if not due:
                continue
            self._last_run[name] = now
            try:
                current_app.tasks[task].apply(args=args)
                ran.append(name)
            except Exception:
                log.exception("periodic job %s failed", name)
        return ran

    def _schedules(self) -> list[tuple[str, str, list[Any], Any]]:
        from celery.schedules import schedule as every

        found: list[tuple[str, str, list[Any], Any]] = []
        for name, entry in getattr(settings, "CELERY_BEAT_SCHEDULE", {}).items():
            plan = entry["schedule"]
            plan = every(plan) if isinstance(plan, int | float) else plan
            found.append((name, entry["task"], list(entry.get("args", [])), plan))
        from django_celery_beat.models import PeriodicTask

        for row in PeriodicTask.objects.filter(enabled=True):
            import json

            found.append((f"db:{row.pk}", row.task, json.loads(row.args or "[]"), row.schedule))
        return found


def shortest_interval() -> float:
    """How often to check: every ``CHECK_EVERY`` seconds, or as often as the shortest fixed
    schedule given in seconds runs (the reservations' tick, ``RESERVATIONS_TICK_SECONDS``)."""
    plans = (entry["schedule"] for entry in getattr(settings, "CELERY_BEAT_SCHEDULE", {}).values())
    seconds = [float(plan) for plan in plans if isinstance(plan, int | float)]
    return min([CHECK_EVERY, *seconds])
