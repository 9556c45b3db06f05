"""kill -9 of ``serve`` at random moments during swaps loses no audit row (issue 11, item 4).

Three simulated models and ``--models-max 1``: every request for another model is a swap (an
eviction, a load, a ready). The test runs ``serve`` again and again on one data dir, drives swaps
and SIGKILLs it at a random moment — during part of the run with the SQLite database locked by
another process, so rows pile up unstored. Two observers outside the router:

* an SSE client per incarnation records what the router *did* (a child spawned, a model ready),
  and every such effect must have its audit row: rows are journaled before effects happen;
* the journal files left on disk after the last kill name every row each dead router had made;
  after a final restart drains them, the database must hold exactly those rows, once each.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from tests.support.auditdb import audit_rows
from tests.support.chaos import chat, kill9, record
from tests.support.ports import free_port
from tests.support.serving import run_manage, sim_preset, wait_until

SWAPS = 20
MODELS = ("a", "b", "c")


class Effects:
    """What one incarnation's /models/sse stream showed: spawns and readies per model."""

    def __init__(self, url: str) -> None:
        self.loading: Counter[str] = Counter()
        self.loaded: Counter[str] = Counter()
        self._url = url
        threading.Thread(target=self._run, daemon=True).start()
        time.sleep(0.3)  # let the subscription open before the test acts

    def _run(self) -> None:
        try:
            with httpx.stream("GET", f"{self._url}/models/sse", timeout=None) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    item = json.loads(line[6:])
                    status = (item.get("data") or {}).get("status")
                    if item["event"] == "model_status" and status == "loading":
                        self.loading[item["model"]] += 1
                    elif item["event"] == "status_change" and status == "loaded":
                        self.loaded[item["model"]] += 1
        except httpx.HTTPError:
            pass  # killed: the stream just ends


def hold_database(db: Path, seconds: float) -> threading.Thread:
    """Lock the SQLite database exclusively for ``seconds`` from another connection."""

    def hold() -> None:
        conn = sqlite3.connect(db, timeout=30, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


def journal_rows(directory: Path) -> set[tuple[str, int]]:
    """Every row the journals name: finished ones and pending ones (stored incomplete)."""
    out: set[tuple[str, int]] = set()
    for path in directory.glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            try:
                record_ = json.loads(line)
            except ValueError:
                continue
            row = record_.get("r") or record_.get("p")
            if row:
                out.add((row["router_id"], row["seq"]))
    return out


def test_kill_9_during_swaps_loses_no_audit_row(tmp_path: Path) -> None:
    marker = f"k9-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text("".join(sim_preset(m, marker, load_ms=30) for m in MODELS))
    data = tmp_path / "data"
    rng = random.Random(1101)
    swaps, kills, boots_effects = 0, 0, []
    journal = data / "audit-journal"
    expected: set[tuple[str, int]] = set()
    locked_kill = False
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    while swaps < SWAPS:
        with run_manage(args, data, port=free_port()) as server:
            effects = Effects(server.url)
            boots_effects.append(effects)
            deadline = time.monotonic() + rng.uniform(0.2, 1.2)
            holder = None
            if kills == 2:  # this incarnation's rows pile up behind a locked database
                holder = hold_database(data / "routerpanel.sqlite3", 4.0)
                deadline = time.monotonic() + 2.0
                locked_kill = True
            n = 0
            while time.monotonic() < deadline:
                model = MODELS[(swaps + n) % len(MODELS)]
                try:
                    response = httpx.post(
                        f"{server.url}/v1/chat/completions", json=chat(model), timeout=30
                    )
                except httpx.HTTPError:
                    break
                assert response.status_code == 200, response.text
                n += 1
            swaps += n
            time.sleep(rng.uniform(0.0, 0.05))  # the kill lands mid-flight, not at a pause
            kill9(server.process)
            kills += 1
            expected |= journal_rows(journal)  # what this router had made, before the next
            if holder is not None:  # start stores and deletes its journal
                holder.join(10)
    assert expected, "the journal held the rows of the killed routers"

    with run_manage(args, data, port=free_port()) as server:
        dead = {boot for boot, _ in expected}
        wait_until(lambda: not [p for p in journal.glob("*.jsonl")
                                if any(b.replace(":", "_") in p.name for b in dead)],
                   60, "the dead routers' journals to be stored")  # fmt: skip
        rows = [r for r in audit_rows(server.data_dir) if r["router_id"] in dead]
    stored = [(r["router_id"], r["seq"]) for r in rows]
    assert len(stored) == len(set(stored))  # exactly once
    assert set(stored) == expected  # nothing the journals held was lost
    for boot_effects, boot in zip(boots_effects, _boots_in_order(rows), strict=False):
        mine = [r for r in rows if r["router_id"] == boot]
        loading = Counter(r["model"] for r in mine if r["kind"] == "loading")
        ready = Counter(r["model"] for r in mine if r["kind"] == "ready")
        assert loading >= boot_effects.loading  # every spawn seen outside has its row
        assert ready >= boot_effects.loaded
    incomplete = [
        r for r in rows if "router stopped" in json.loads(r["details"]).get("incomplete", [])
    ]
    kinds = Counter(r["kind"] for r in rows)
    record(
        "kill -9 of serve during swaps", swaps=swaps, kills=kills, with_database_locked=locked_kill,
        journal_rows=len(expected), stored=len(stored), rows_lost=len(expected - set(stored)),
        stored_incomplete=len(incomplete), kinds=dict(kinds),
    )  # fmt: skip
    assert kinds["eviction"] >= swaps - kills * 2  # nearly every swap evicted someone


def _boots_in_order(rows: list[dict[str, Any]]) -> list[str]:
    first: dict[str, str] = {}
    for row in rows:
        first.setdefault(row["router_id"], row["time"])
    return sorted(first, key=lambda boot: first[boot])
