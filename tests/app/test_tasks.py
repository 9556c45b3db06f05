"""The Celery jobs, called directly (STYLE 15): GGUF inspection on save, audit retention, memory
rollups, scheduled preloads. tests/services/test_celery_worker.py runs them in a real worker."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer
from django_celery_beat.models import PeriodicTask

from models_app import tasks
from models_app.audit.records import purge_expired
from models_app.models import AuditEvent, AuditKind, MemoryRollup, Preset, RouterSettings
from models_app.routing.client import RouterClient
from routerpanel.router import gguf
from tests.support.fake_router import MemoryRouter, ring
from tests.support.ggufgen import FAKE_VOCAB_SIZE, write_tiny_llama

MIB = 1 << 20


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return write_tiny_llama(
        tmp_path / "tiny.gguf", n_embd=64, n_layer=2, n_head=4, n_ff=128, ctx=2048,
        vocab_path=None, seed=7, n_head_kv=2,
    )  # fmt: skip


def make_preset(path: Path | str, *args: list[str]) -> Preset:
    return Preset.objects.create(name="tiny", model_path=str(path), args=list(args))


@pytest.mark.django_db
class TestGgufInspection:
    def test_it_stores_the_facts_and_the_estimate_for_the_presets_context(
        self, model_file: Path
    ) -> None:
        preset = make_preset(model_file, ["c", "1024"])
        facts = tasks.inspect_preset(preset.pk)
        preset.refresh_from_db()
        assert facts == preset.gguf_facts
        assert (facts["architecture"], facts["layers"], facts["heads"], facts["kv_heads"]) == (
            "llama",
            2,
            4,
            2,
        )
        assert facts["context_length"] == 2048 and facts["vocab_size"] == FAKE_VOCAB_SIZE
        assert facts["quantisation"] == "MOSTLY_F16" and facts["file_size"] > 0
        assert facts["parameter_count"] > 0
        expected = gguf.estimate_memory(gguf.inspect(model_file), 1024)
        assert preset.gguf_estimate == expected.total
        assert facts["estimate"]["n_ctx"] == 1024 and facts["estimate"]["kv_cache_type"] == "f16"
        # KV cache at f16: ctx × layers × (K + V width) × 2 bytes; K width = 16 × 2 kv heads
        assert facts["estimate"]["kv_cache"] == 1024 * 2 * (32 + 32) * 2

    def test_without_ctx_size_it_uses_the_global_one_else_the_trained_context(
        self, model_file: Path
    ) -> None:
        preset = make_preset(model_file)
        tasks.inspect_preset(preset.pk)
        preset.refresh_from_db()
        assert preset.gguf_facts["estimate"]["n_ctx"] == 2048
        row = RouterSettings.load()
        row.global_args = [["ctx-size", "512"]]
        row.save()
        tasks.inspect_presets()
        preset.refresh_from_db()
        assert preset.gguf_facts["estimate"]["n_ctx"] == 512

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            (b"", "empty file, not a GGUF"),
            (b"not a model at all", "not a GGUF file"),
            (b"GGUF\x03\x00\x00\x00" + b"\xff" * 20, "malformed or truncated GGUF"),
        ],
    )
    def test_a_broken_file_stores_a_clear_message_and_no_estimate(
        self, tmp_path: Path, content: bytes, message: str
    ) -> None:
        path = tmp_path / "broken.gguf"
        path.write_bytes(content)
        preset = make_preset(path)
        tasks.inspect_preset(preset.pk)
        preset.refresh_from_db()
        assert message in preset.gguf_facts["error"] and str(path) in preset.gguf_facts["error"]
        assert preset.gguf_estimate is None

    def test_a_truncated_gguf_and_a_missing_file_are_messages_too(
        self, model_file: Path, tmp_path: Path
    ) -> None:
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(model_file.read_bytes()[: model_file.stat().st_size // 2])
        preset = make_preset(cut)
        tasks.inspect_preset(preset.pk)
        preset.refresh_from_db()
        assert "truncated" in preset.gguf_facts["error"]
        Preset.objects.filter(pk=preset.pk).update(model_path=str(tmp_path / "gone.gguf"))
        tasks.inspect_preset(preset.pk)
        preset.refresh_from_db()
        assert "no such file" in preset.gguf_facts["error"]

    def test_an_unchanged_file_is_not_read_again(
        self, model_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        preset = make_preset(model_file)
        tasks.inspect_preset(preset.pk)
        monkeypatch.setattr(gguf, "inspect", lambda path: pytest.fail("read again"))
        tasks.inspect_preset(preset.pk)

    def test_an_admin_estimate_wins_in_the_engine_spec(self, model_file: Path) -> None:
        from models_app.presets import specs

        preset = make_preset(model_file)
        tasks.inspect_preset(preset.pk)
        _, (spec,) = specs.load_specs()
        assert spec.memory_estimate == Preset.objects.get().gguf_estimate
        Preset.objects.update(memory_estimate=5 << 30)
        _, (spec,) = specs.load_specs()
        assert spec.memory_estimate == 5 << 30

    def test_saving_a_preset_queues_its_inspection_on_commit(
        self, model_file: Path, django_capture_on_commit_callbacks: Any
    ) -> None:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            preset = make_preset(model_file)
        assert len(callbacks) == 1  # eager in embedded mode: it ran at commit
        preset.refresh_from_db()
        assert preset.gguf_facts["architecture"] == "llama"
        with django_capture_on_commit_callbacks() as callbacks:
            preset.save(update_fields=["enabled"])
        assert callbacks == []  # nothing the inspection reads changed


@pytest.mark.django_db
class TestRetention:
    def test_it_keeps_everything_by_default(self) -> None:
        old = AuditEvent.objects.record(AuditKind.CRASH, model="m")
        AuditEvent.objects.filter(pk=old.pk).update(time=datetime(2001, 1, 1, tzinfo=UTC))
        assert tasks.apply_retention() == 0
        assert AuditEvent.objects.count() == 1

    def test_it_deletes_rows_older_than_the_setting_and_audits_that(self) -> None:
        row = RouterSettings.load()
        row.audit_retention_days = 30
        row.save()
        now = datetime(2026, 6, 1, tzinfo=UTC)
        for days in (31, 40, 29):
            event = AuditEvent.objects.record(AuditKind.CRASH, model=f"m{days}")
            AuditEvent.objects.filter(pk=event.pk).update(time=now - timedelta(days=days))
        assert purge_expired(now) == 2
        kept = set(AuditEvent.objects.values_list("model", flat=True))
        assert kept == {"m29", ""}
        (audit_row,) = AuditEvent.objects.filter(kind=AuditKind.RETENTION)
        assert audit_row.details["deleted"] == 2 and audit_row.actor == "retention"


@pytest.mark.django_db
class TestMemoryRollups:
    START = 1_780_000_040.0  # hh:mm:20: the first minute is partial

    def test_each_complete_minute_is_folded_once_per_scope(self) -> None:
        history = ring(self.START, 150, used=8 << 30, rss=1 << 30)  # 40 s, 60 s, 50 s
        now = self.START + 150
        assert tasks.metrics.roll_up(history, now) == 4  # two complete minutes × two scopes
        system = MemoryRollup.objects.get(scope="system", minute=_minute(self.START + 40))
        assert system.samples == 60
        assert (system.used_min, system.used_max) == ((8 << 30) + 40 * MIB, (8 << 30) + 99 * MIB)
        assert system.used_avg == round(((8 << 30) * 60 + sum(range(40, 100)) * MIB) / 60)
        assert system.swap_used_max == 5 * MIB and system.available_min is not None
        model = MemoryRollup.objects.get(scope="model", model="m", minute=system.minute)
        assert model.samples == 30 and model.available_min is None

    def test_running_it_again_changes_nothing_and_more_samples_win(self) -> None:
        history = ring(self.START, 150, used=8 << 30, rss=1 << 30)
        tasks.metrics.roll_up(history, self.START + 150)
        before = list(MemoryRollup.objects.values())
        assert tasks.metrics.roll_up(history, self.START + 150) == 0
        assert tasks.metrics.roll_up(history[30:], self.START + 150) == 0  # a cut-off ring
        assert list(MemoryRollup.objects.values()) == before

    def test_each_node_folds_into_rows_of_its_own(self) -> None:
        """Several hosts: two machines' same minute are two rows, each run again changes
        nothing."""
        small, big = (
            ring(self.START, 150, used=1 << 30, rss=1),
            ring(self.START, 150, used=9 << 30, rss=1),
        )
        assert tasks.metrics.roll_up(small, self.START + 150, node="n1") == 4
        assert tasks.metrics.roll_up(big, self.START + 150, node="n2") == 4
        assert tasks.metrics.roll_up(big, self.START + 150, node="n2") == 0
        minute = _minute(self.START + 40)
        used = dict(MemoryRollup.objects.filter(scope="system", minute=minute)
                    .values_list("node", "used_min"))  # fmt: skip
        assert used == {"n1": (1 << 30) + 40 * MIB, "n2": (9 << 30) + 40 * MIB}

    def test_rows_older_than_thirty_days_are_deleted(self) -> None:
        old = datetime.fromtimestamp(self.START, tz=UTC) - timedelta(days=31)
        MemoryRollup.objects.create(minute=old, scope="system", samples=1, used_min=1,
                                    used_avg=1, used_max=1)  # fmt: skip
        tasks.metrics.roll_up(ring(self.START, 130, used=1, rss=1), self.START + 130)
        assert not MemoryRollup.objects.filter(minute=old).exists()


def _minute(t: float) -> datetime:
    return datetime.fromtimestamp(int(t // 60) * 60, tz=UTC)


@pytest.fixture
async def router() -> AsyncIterator[tuple[MemoryRouter, RouterClient]]:
    layer = InMemoryChannelLayer()
    fake = await MemoryRouter(layer).start()
    yield fake, RouterClient(layer, timeout=2.0)
    await fake.stop()


@pytest.mark.django_db(transaction=True)
class TestRouterJobs:
    async def test_the_rollup_job_asks_the_router_for_its_ring(self, router: Any) -> None:
        fake, client = router
        now = time.time()
        fake.history = ring(now - 200, 200, used=4 << 30, rss=1 << 30)
        written = await sync_to_async(tasks.roll_up_memory, thread_sensitive=False)(client)
        assert written >= 4 and await MemoryRollup.objects.acount() == written
        await fake.wait_for("router.memory")
        assert fake.of_type("router.snapshot") == []  # the ring, not the whole snapshot

    async def test_the_rollup_job_skips_a_router_that_does_not_answer(self) -> None:
        client = RouterClient(InMemoryChannelLayer(), timeout=0.2)
        assert await sync_to_async(tasks.roll_up_memory, thread_sensitive=False)(client) == 0

    async def test_a_preload_is_a_load_by_the_schedule(self, router: Any) -> None:
        fake, client = router
        fake.add("qwen-7b")
        answer = await sync_to_async(tasks.preload, thread_sensitive=False)("qwen-7b", client)
        assert answer == {"success": True}
        message = await fake.wait_for("router.load")
        assert (message["model"], message["actor"]) == ("qwen-7b", "schedule")
        again = await sync_to_async(tasks.preload, thread_sensitive=False)("qwen-7b", client)
        assert again["already_running"] is True

    async def test_a_weekday_preload_is_a_periodic_task_beat_runs_with_our_task(self) -> None:
        # What the admin's "add periodic task" form stores for "load qwen-7b at 9:00 on weekdays".
        from django_celery_beat.models import CrontabSchedule

        from routerpanel.celery import app

        cron = await CrontabSchedule.objects.acreate(minute="0", hour="9", day_of_week="1-5")
        task = await PeriodicTask.objects.acreate(
            name="preload qwen-7b", task="models_app.tasks.preload_model", crontab=cron,
            args='["qwen-7b"]',
        )  # fmt: skip
        stored = await PeriodicTask.objects.select_related("crontab").aget(pk=task.pk)
        assert (stored.crontab.hour, stored.crontab.minute, stored.crontab.day_of_week) == (
            "9",
            "0",
            "1-5",
        )
        assert app.tasks[stored.task].name == tasks.preload_model.name  # registered, not a typo


@pytest.mark.django_db
def test_admins_schedule_preloads_in_the_admin_with_our_task_offered() -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("admin", "", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    page = client.get("/admin/django_celery_beat/periodictask/add/")
    assert page.status_code == 200
    assert b"models_app.tasks.preload_model" in page.content
