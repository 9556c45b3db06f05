"""The usage page (issue 17.2): behind login, a viewer's own rows only, everyone's for an
operator, the chart's data and library, and a CSV that a spreadsheet cannot run."""

from __future__ import annotations

import csv
import io
import json
import time

import pytest
from django.test import Client

from models_app.accounts import usage

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


@pytest.fixture
def rows() -> None:
    now = time.time()
    usage.write_batch(
        [
            usage.Usage("key:vera/laptop", "qwen", now, completion_tokens=5, duration=2.0),
            usage.Usage("key:otto/ci", "llama", now, completion_tokens=7, duration=3.0,
                        caused_load=True, load=1.5, evicted=("qwen",)),
            usage.Usage("key:=cmd|x/evil", "llama", now, duration=1.0),
        ]
    )  # fmt: skip


def test_the_page_needs_a_sign_in() -> None:
    response = Client().get("/usage/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_viewer_sees_only_their_own_usage(viewer_client: Client, rows: None) -> None:
    response = viewer_client.get("/usage/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "vera" in page and "otto" not in page
    assert 'href="/usage/" aria-current="page"' in page  # the nav link
    assert "vendor/uplot/uPlot.iife.min.js" in page and "panel/usage.js" in page
    hourly = json.loads(page.split('id="usage-hourly" type="application/json">')[1].split("<")[0])
    assert [(h["model"], h["completion_tokens"]) for h in hourly] == [("qwen", 5)]


def test_an_operator_sees_everyones_by_model(operator_client: Client, rows: None) -> None:
    page = operator_client.get("/usage/?by=model").content.decode()
    assert "qwen" in page and "llama" in page
    hourly = json.loads(page.split('id="usage-hourly" type="application/json">')[1].split("<")[0])
    assert {h["model"] for h in hourly} == {"qwen", "llama"}


def test_the_csv_escapes_formulas(operator_client: Client, rows: None) -> None:
    response = operator_client.get("/usage/?by=actor&format=csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(response.content.decode())))
    assert table[0][:3] == ["actor", "requests", "prompt_tokens"]
    actors = {row[0]: row for row in table[1:]}
    assert set(actors) == {"vera", "otto", "'=cmd|x"}
    assert actors["otto"][5] == "1" and actors["otto"][6] == "1.5"  # loads and seconds caused


def test_a_viewers_csv_is_their_own(viewer_client: Client, rows: None) -> None:
    table = list(csv.reader(io.StringIO(viewer_client.get("/usage/?format=csv").content.decode())))
    assert [row[0] for row in table[1:]] == ["vera"]
