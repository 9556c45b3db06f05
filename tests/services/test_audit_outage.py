"""Nothing lost: PostgreSQL goes away in the middle of a run of evictions and comes back; every
audit row is stored, in the order it was produced, exactly once (issue 5, DESIGN §6).

The router side runs in a subprocess (this module, run as a script): a real Engine with the
fake supervisor of the unit tests, and the AuditWriter writing to a fresh PostgreSQL database.
The test breaks that database from outside — it refuses new connections
(``ALTER DATABASE … ALLOW_CONNECTIONS false``) and terminates the writer's backend — while
the router keeps evicting, then lets it back in, and compares what the writer produced with
what PostgreSQL holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.databases import PG_ADMIN_URL
from tests.support.waits import settled

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = (6, 8, 6)  # evictions before, during and after the outage
TIMEOUT = 120.0


def test_every_row_produced_during_an_outage_is_stored_once_in_order(
    pg_database: str, tmp_path: Path
) -> None:
    import psycopg

    env = {
        **os.environ,
        "DATABASE_URL": pg_database,
        "ROUTERPANEL_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "routerpanel.settings",
    }
    env.pop("REDIS_URL", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=TIMEOUT,
    )  # fmt: skip
    name = pg_database.rsplit("/", 1)[1]
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.services.test_audit_outage", str(tmp_path / "journal")],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    admin = psycopg.connect(PG_ADMIN_URL, autocommit=True)
    try:
        before = _expect(driver, "phase")
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        _send(driver, "outage")
        during = _expect(driver, "phase")
        assert during["outages"] == 1 and during["stored"] < during["produced"], during
        assert during["journaled"] >= during["produced"], during  # waiting on disk, not in RAM
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        _send(driver, "restored")
        result = _expect(driver, "done")
        assert driver.wait(TIMEOUT) == 0
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()
        if driver.poll() is None:
            driver.kill()

    with psycopg.connect(pg_database) as conn:
        stored = [
            row[0]
            for row in conn.execute(
                "SELECT seq FROM models_app_auditevent WHERE router_id = %s ORDER BY id",
                (result["router_id"],),
            )
        ]
        kinds = dict(
            conn.execute(
                "SELECT kind, count(*) FROM models_app_auditevent WHERE router_id = %s "
                "GROUP BY kind",
                (result["router_id"],),
            ).fetchall()
        )
    produced = result["produced"]
    print(
        f"\naudit outage: produced {len(produced)} rows ({before['produced']} before, "
        f"{during['produced'] - before['produced']} during the outage, "
        f"{len(produced) - during['produced']} after); waiting in the journal at the outage's "
        f"end {during['produced'] - during['stored']}; "
        f"stored {len(stored)} ({len(set(stored))} distinct); outages seen {result['outages']}; "
        f"kinds {kinds}"
    )
    assert stored == produced  # every row, once, in the order produced
    assert kinds["eviction"] == sum(ROUNDS) - 1  # the first load had nothing to evict
    assert result["outages"] == 1 and result["stored"] == len(produced)


def _send(driver: subprocess.Popen[str], line: str) -> None:
    assert driver.stdin is not None
    driver.stdin.write(line + "\n")
    driver.stdin.flush()


def _expect(driver: subprocess.Popen[str], tag: str) -> dict[str, Any]:
    assert driver.stdout is not None
    line = driver.stdout.readline()
    assert line.startswith(tag + " "), f"driver said {line!r} (exit {driver.poll()})"
    return json.loads(line.split(" ", 1)[1])


# ---- the router side (run as a script) -------------------------------------------------------


async def _drive(journal: Path) -> None:
    import asyncio

    from models_app.audit.writer import AuditWriter
    from routerpanel.router.commands import MemorySampled
    from routerpanel.router.memory import SystemMemory
    from tests.support.engine import make

    engine, sup, _ = await make("a", "b", "c", start=False, models_max=1)
    writer = AuditWriter(journal, interval=0.05, retry_interval=0.2, max_retry_interval=1.0)
    produced: list[int] = []
    emit = writer.mapper._emit

    def record(row: dict[str, Any]) -> None:
        produced.append(row["seq"])
        emit(row)

    writer.mapper._emit = record
    writer.start()
    sub = engine.subscribe(maxsize=100_000)

    async def listen() -> None:
        async for event in sub:
            writer(event)

    listener = asyncio.create_task(listen())
    await engine.start()
    order = ["a", "b", "c"]

    async def idle() -> None:
        await engine.until_idle()
        await asyncio.sleep(0.005)

    async def evictions(count: int) -> None:
        for _ in range(count):
            model = order[len(produced) % 3] if not sup.children else _next(sup.children)
            waiting = asyncio.create_task(engine.acquire(model, request_id=f"r{len(produced)}",
                                                         actor="key:alice/laptop"))  # fmt: skip
            await idle()
            for victim in [n for n in sup.children if n != model]:
                sup.exit(victim)
                await idle()
                sup.post(MemorySampled(SystemMemory(64 << 30, 40 << 30, 24 << 30, 0, 0, None), ()))
                await idle()
            sup.ready(model)
            await idle()
            engine.release((await settled(waiting)).lease_id)
            await idle()

    def _next(children: dict[str, int]) -> str:
        running = next(iter(children))
        return order[(order.index(running) + 1) % 3]

    def report(tag: str, **extra: Any) -> None:
        facts = {"produced": len(produced), "stored": writer.stored}
        facts |= {"journaled": writer.journal.appended, "outages": writer.outages} | extra
        print(tag, json.dumps(facts), flush=True)

    await evictions(ROUNDS[0])
    await asyncio.to_thread(writer.flush, 30)
    report("phase")
    assert (await asyncio.to_thread(sys.stdin.readline)).strip() == "outage"
    await evictions(ROUNDS[1])
    deadline = asyncio.get_running_loop().time() + 30
    while writer.outages == 0 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)  # the writer has met the outage
    report("phase")
    assert (await asyncio.to_thread(sys.stdin.readline)).strip() == "restored"
    await evictions(ROUNDS[2])
    shutdown = asyncio.create_task(engine.shutdown())
    await idle()
    for name in list(sup.children):
        sup.exit(name)
    await asyncio.wait_for(shutdown, 30)
    await settled(listener)
    stored = await asyncio.to_thread(writer.flush, 60)
    await asyncio.to_thread(writer.close, 30)
    report("done", produced=produced, router_id=writer.router_id, all_stored=stored)


if __name__ == "__main__":
    import asyncio

    import django

    django.setup()
    asyncio.run(_drive(Path(sys.argv[1])))
