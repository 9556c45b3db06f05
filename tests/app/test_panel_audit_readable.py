"""A readable audit log (issue 19): reasons in the panel's words instead of field names, a
change as a before/after table instead of nested JSON, a picker of the known models, and a
filter that does not parse is an error, not an empty list."""

from __future__ import annotations

import pytest
from django.test import Client

from models_app.audit import records as audit
from models_app.models import AuditEvent, AuditKind, Preset, RouterSettings

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


def test_a_settings_change_reads_in_words_with_a_before_after_table(
    viewer_client: Client,
) -> None:
    row = RouterSettings.load()
    before = audit.settings_state(row)
    row.models_max, row.global_args = 3, [["ctx-size", "8192"], ["temp", "0.5"]]
    event = audit.record_settings_change(before, row, "user:ada")
    assert event is not None and event.reason == "global_args, models_max"  # as stored
    listing = viewer_client.get("/audit/").content.decode()
    assert "[*] options, Max running models" in listing and "global_args" not in listing
    detail = viewer_client.get(f"/audit/{event.pk}/").content.decode()
    table = detail[detail.index('id="audit-changes"') :]
    table = table[: table.index("</table>")]
    assert '<th scope="row">Max running models</th>' in table
    assert '<td class="after">ctx-size = 8192<br>temp = 0.5</td>' in table
    assert "<pre>" not in detail  # no JSON diff


def test_the_model_filter_is_a_picker_of_presets_and_audited_models(viewer_client: Client) -> None:
    Preset.objects.create(name="demo-small")
    AuditEvent.objects.record(AuditKind.READY, model="gone-model", actor="scheduler")
    text = viewer_client.get("/audit/").content.decode()
    picker = text[text.index('<select id="id_model"') :]
    picker = picker[: picker.index("</select>")]
    assert '<option value="">any model</option>' in picker
    assert '<option value="demo-small">' in picker and '<option value="gone-model">' in picker
    chosen = viewer_client.get("/audit/?model=gone-model").content.decode()
    assert '<option value="gone-model" selected>' in chosen


def test_an_invalid_since_is_a_form_error_not_zero_rows(viewer_client: Client) -> None:
    AuditEvent.objects.record(AuditKind.READY, model="alpha", actor="scheduler")
    text = viewer_client.get("/audit/?since=yesterday-ish").content.decode()
    assert 'id="filter-errors"' in text and "autofocus" in text
    assert '<a href="#id_since">Since</a>: Enter a valid date/time.' in text
    assert "Fix the filter above to see events." in text and "No events match." not in text
