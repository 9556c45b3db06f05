"""Embedded mode runs the periodic jobs itself (no celery beat there)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from celery import shared_task
from django.test import override_settings
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from models_app.embedded_beat import EmbeddedBeat

pytestmark = pytest.mark.django_db
RAN: list[str] = []


@shared_task(name="tests.beat_probe")
def beat_probe(label: str = "fixed") -> None:
    RAN.append(label)


@override_settings(CELERY_BEAT_SCHEDULE={"probe": {"task": "tests.beat_probe", "schedule": 60.0}})
def test_a_fixed_schedule_runs_when_due_and_not_before() -> None:
    RAN.clear()
    beat = EmbeddedBeat()
    start = timezone.now()
    assert beat.run_due(start) == []  # the first look only starts the clock
    beat._last_run["probe"] = start - timedelta(seconds=30)
    assert beat.run_due(start) == []
    beat._last_run["probe"] = start - timedelta(seconds=61)
    assert beat.run_due(start) == ["probe"]
    assert RAN == ["fixed"]


@override_settings(CELERY_BEAT_SCHEDULE={})
def test_an_admins_scheduled_preload_row_runs_with_its_arguments() -> None:
    RAN.clear()
    every_minute = CrontabSchedule.objects.create(minute="*", hour="*")
    row = PeriodicTask.objects.create(
        name="preload", task="tests.beat_probe", crontab=every_minute, args=json.dumps(["m1"])
    )
    beat = EmbeddedBeat()
    beat._last_run[f"db:{row.pk}"] = timezone.now() - timedelta(minutes=2)
    assert beat.run_due() == [f"db:{row.pk}"]
    assert RAN == ["m1"]
    row.enabled = False
    row.save()
    assert beat.run_due() == []
