"""The audit CSV export never hands a spreadsheet a formula (OWASP CSV injection, issue 13).

The probe: a client's ``X-Request-Id: =2+5`` is a valid request id, lands in audit rows as the
request that caused an eviction, and was exported as a live formula. Every text cell starting
with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return now gets a leading apostrophe.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.test import Client

from models_app.api.request import request_id_from
from models_app.models import AuditEvent, AuditKind
from models_app.security import csv_cell

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


def exported(client: Client) -> list[dict[str, str]]:
    response = client.get("/audit/?format=csv")
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_a_client_request_id_cannot_become_a_formula(viewer_client: Client) -> None:
    request_id = request_id_from(b"=2+5")
    assert request_id == "=2+5"  # a valid id: it reaches the audit log as sent
    AuditEvent.objects.record(
        AuditKind.EVICTION, model="alpha", trigger_model="beta", trigger_request=request_id
    )
    [row] = exported(viewer_client)
    assert row["trigger_request"] == "'=2+5"
    assert row["model"] == "alpha"


@pytest.mark.parametrize("text", ['=HYPERLINK("x")', "+1", "-1+2", "@SUM(A1)", "\tx", "\rx"])
def test_every_formula_start_is_escaped_in_every_text_column(
    viewer_client: Client, text: str
) -> None:
    AuditEvent.objects.record(
        AuditKind.PRESET_CHANGED, model=text, actor=text, reason=text, details={"k": text}
    )
    [row] = exported(viewer_client)
    for column in ("model", "actor", "reason"):
        assert row[column] == "'" + text, column
    assert json.loads(row["details"]) == {"k": text}  # a JSON object starts with "{": kept


def test_numbers_and_ordinary_text_are_unchanged(viewer_client: Client) -> None:
    AuditEvent.objects.record(
        AuditKind.EXITED, model="qwen-7b", reason="exit code -9", exit_code=-9, stop_seconds=0.5
    )
    [row] = exported(viewer_client)
    assert (row["model"], row["reason"]) == ("qwen-7b", "exit code -9")
    assert (row["exit_code"], row["stop_seconds"]) == ("-9", "0.5")  # numbers stay numbers


def test_the_cell_rule() -> None:
    assert csv_cell("=1") == "'=1"
    assert csv_cell("a=1") == "a=1"
    assert csv_cell(-3) == -3
    assert csv_cell("") == ""
