"""The change counter the database raises itself, and the watch that reloads on it
(models.ConfigChange, migration 0021, config_watch.py)."""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection

from models_app.models import NodeSettings, Preset, RouterSettings
from models_app.routing.config_watch import ConfigWatch, read_version
from tests.support.waits import settled


@pytest.mark.django_db
class TestTheCounter:
    def test_every_kind_of_write_to_presets_and_settings_raises_it(self) -> None:
        seen = [read_version()]

        def moved() -> bool:
            seen.append(read_version())
            return seen[-1] > seen[-2]

        preset = Preset.objects.create(name="m")
        assert moved()  # an ORM insert
        Preset.objects.filter(pk=preset.pk).update(ttl=30)  # no signal sees this one
        assert moved()
        with connection.cursor() as cursor:  # nor this one
            cursor.execute("UPDATE models_app_preset SET pinned = %s", [True])
        assert moved()
        row = RouterSettings.load()
        row.models_max = 3
        row.save()
        assert moved()
        NodeSettings.objects.create(node="studio-2")
        assert moved()
        Preset.objects.filter(name="m").delete()
        assert moved()

    def test_other_tables_leave_it_alone(self, django_user_model: object) -> None:
        before = read_version()
        django_user_model.objects.create(username="ann")  # type: ignore[attr-defined]
        assert read_version() == before


class TestTheWatch:
    async def test_it_reloads_once_per_change_and_never_for_the_baseline(self) -> None:
        versions = iter([4, 4, 5, 5, 5, 7])
        reloads: list[str] = []

        async def reload(actor: str) -> None:
            reloads.append(actor)

        watch = ConfigWatch(reload, interval=0, read=lambda: next(versions))
        watch.version = 4
        for _ in range(6):
            await watch.check()
        assert reloads == ["database", "database"] and watch.version == 7

    async def test_a_database_away_is_asked_again_and_a_failed_reload_does_not_stop_it(
        self,
    ) -> None:
        answers: list[object] = [RuntimeError("connection refused"), 2, 3]

        def read() -> int:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return int(answer)  # type: ignore[call-overload]

        calls = 0

        async def reload(actor: str) -> None:
            nonlocal calls
            calls += 1
            raise ValueError("a preset that no longer parses")

        watch = ConfigWatch(reload, interval=0, read=read)
        watch.version = 1
        await watch.check()  # the read failed: nothing happens
        assert watch.version == 1 and calls == 0
        await watch.check()
        await watch.check()
        assert watch.version == 3 and calls == 2

    async def test_run_takes_its_baseline_then_follows(self) -> None:
        versions = [None, 1, 1, 2]
        changed = asyncio.Event()

        def read() -> int:
            value = versions.pop(0) if len(versions) > 1 else versions[0]
            if value is None:
                raise RuntimeError("not yet")
            return value

        async def reload(actor: str) -> None:
            changed.set()

        watch = ConfigWatch(reload, interval=0.001, read=read)
        task = asyncio.create_task(watch.run())
        try:
            await settled(changed.wait())
            assert watch.version == 2 and watch.reloads == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
