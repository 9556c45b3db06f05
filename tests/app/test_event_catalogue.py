"""One event catalogue (routerpanel/router/catalogue.py), read by every reader through a table.

Rename or add an event and these fail until every reader has decided what to do with it; an
event name spelled anywhere but the catalogue fails them too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from models_app.audit import mapper as audit_mapper
from models_app.audit.mapper import AuditMapper
from models_app.routing import metrics
from models_app.routing.metrics import RouterMetrics
from routerpanel.router.catalogue import Event, names

REPO = Path(__file__).resolve().parents[2]
ALTERNATIVES = "|".join(re.escape(e.value) for e in Event)
QUOTED = re.compile(rf"""["']({ALTERNATIVES})["']""")


@pytest.mark.parametrize(
    ("handled", "ignored"),
    [
        (set(AuditMapper(lambda row: None)._handlers), audit_mapper.IGNORED),
        (set(RouterMetrics()._handlers), metrics.IGNORED),
    ],
    ids=["audit", "metrics"],
)
def test_every_reader_handles_or_ignores_every_event(
    handled: set[Event], ignored: frozenset[Event]
) -> None:
    assert handled | ignored == set(Event)
    assert not handled & ignored


def test_the_browser_gets_the_names_from_the_catalogue() -> None:
    assert names()["MODEL_STATE"] == "model.state"
    assert len(names()) == len(Event)


def test_no_event_name_is_spelled_outside_the_catalogue() -> None:
    sources = [
        *(REPO / "routerpanel").rglob("*.py"),
        *(REPO / "models_app").rglob("*.py"),
        *(REPO / "static" / "panel").glob("*.js"),
        *(REPO / "tests").rglob("*.py"),
        *(REPO / "bench").rglob("*.py"),
    ]
    spelled = {}
    for path in sources:
        if path.name == "catalogue.py" or "migrations" in path.parts or path == Path(__file__):
            continue  # this file checks the names themselves
        found = QUOTED.findall(path.read_text())
        if found:
            spelled[str(path.relative_to(REPO))] = sorted(set(found))
    assert spelled == {}


def test_the_dashboard_page_carries_the_catalogue(admin_client: object) -> None:
    page = admin_client.get("/").content.decode()  # type: ignore[attr-defined]
    assert '<script id="event-names" type="application/json">' in page
    assert '"MODEL_STATE": "model.state"' in page


def test_the_page_carries_the_state_sets_so_scripts_count_stuck_children(
    admin_client: object,
) -> None:

    page = admin_client.get("/").content.decode()  # type: ignore[attr-defined]
    found = re.search(r'<script id="model-states" type="application/json">(.*?)</script>', page)
    assert found is not None
    sets = json.loads(found.group(1))
    assert sets["RUNNING"] == ["loaded", "loading", "sleeping", "stuck"]  # counted toward the max
    assert "stuck" not in sets["STOPPABLE"] and "quarantined" in sets["DOWN"]
    scripts = (REPO / "static" / "panel").glob("*.js")
    spelled = [p.name for p in scripts if re.search(r'new Set\(\[\s*"loading"', p.read_text())]
    assert spelled == []  # no script keeps its own copy of a state set
