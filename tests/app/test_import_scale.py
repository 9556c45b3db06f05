"""An import of many presets (a ``--models-preset`` file of thousands): a bounded number of queries,
every preset and its audit row written, and one inspection task for them all after the commit."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from models_app import tasks
from models_app.models import AuditEvent, AuditKind, Preset
from models_app.presets.files import import_presets

pytestmark = pytest.mark.django_db

COUNT = 500


def ini(count: int, *, extra: str = "") -> str:
    text = "[*]\nctx-size = 4096\n"
    for n in range(count):
        text += f"\n[team/model-{n:05d}]\nmodel = /models/m{n}.gguf\nctx-size = 8192\n"
    return text + extra


def test_many_new_presets_take_a_bounded_number_of_queries(
    django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued: list[Any] = []
    monkeypatch.setattr(tasks.inspect_presets_task, "delay", lambda ids=None: queued.append(ids))
    monkeypatch.setattr(tasks.inspect_preset_task, "delay", lambda pk: queued.append(pk))
    with django_capture_on_commit_callbacks(execute=True), CaptureQueriesContext(connection) as q:
        report = import_presets(ini(COUNT), source="big.ini")
    assert len(report.created) == COUNT
    # It was three per preset and more (a uniqueness check, an insert, an audit insert, the
    # settings read twice): 2,500+ for 500. Now batches: a few dozen whatever the count.
    assert len(q.captured_queries) < 60, len(q.captured_queries)
    assert Preset.objects.count() == COUNT
    stored = Preset.objects.get(name="team/model-00321")
    assert stored.args == [["ctx-size", "8192"]] and stored.updated_at is not None
    rows = AuditEvent.objects.filter(kind=AuditKind.PRESET_CREATED)
    assert rows.count() == COUNT and rows.filter(model="team/model-00321", actor="cli").exists()
    ids = set(Preset.objects.values_list("pk", flat=True))
    assert [set(batch) for batch in queued if isinstance(batch, list)] == [ids]  # one task


def test_the_same_file_again_changes_nothing_and_a_bad_preset_keeps_nothing() -> None:
    import_presets(ini(50), source="a.ini")
    again = import_presets(ini(50), source="a.ini")
    assert len(again.unchanged) == 50 and not again.created
    bad = "\n[team/broken]\nmodel = /models/b.gguf\nctx-sizee = 1\n"
    with pytest.raises(Exception, match="ctx-sizee"):
        import_presets(ini(120, extra=bad), source="b.ini")
    assert Preset.objects.count() == 50  # none of the 70 new ones: all or nothing
    assert AuditEvent.objects.filter(kind=AuditKind.PRESET_CREATED).count() == 50
