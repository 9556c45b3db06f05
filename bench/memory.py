"""RouterPanel's own memory: RSS of its web and router processes, idle and under load.

    .venv/bin/python bench/memory.py [--seconds 10]

Embedded mode is one process (``manage.py serve``: Daphne and the router worker). Team mode is
``manage.py runrouter`` plus one ``manage.py serve --no-router`` over Redis and PostgreSQL; it
is measured when both answer on 127.0.0.1 (a throw-away database is created and dropped).
The children are two simulated llama-servers (their memory is not counted: only the RouterPanel
processes themselves).

Phases: idle (both models loaded, no traffic: median of 10 samples over 1 s), under load
(``--seconds`` of 16 concurrent streamed chats of 64 tokens plus 4 clients sending /tokenize in a
loop: median and peak of samples every 100 ms), and idle again 3 s after the load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from bench.common import Client, Proc, Processes, Table

MODELS = ("sim-a", "sim-b")
PG_ADMIN_URL = os.environ.get(
    "ROUTERPANEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("ROUTERPANEL_TEST_REDIS", "redis://127.0.0.1:6379/15")


def rss_samples(procs: dict[str, Proc], seconds: float, interval: float) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {name: [] for name in procs}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            out[name].append(proc.rss())
        time.sleep(interval)
    return out


def load(port: int, seconds: float) -> tuple[threading.Event, list[threading.Thread], list[int]]:
    """Start 16 streaming and 4 tokenizing clients for ``seconds``; count requests done."""
    stop = threading.Event()
    done = [0]
    lock = threading.Lock()

    def streams(model: str) -> None:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 64, "stream": True}).encode()  # fmt: skip
        client = Client(port, reuse=False)
        while not stop.is_set():
            client.post("/v1/chat/completions", body)
            with lock:
                done[0] += 1

    def tokenize(model: str) -> None:
        body = json.dumps({"model": model, "content": "Hello world"}).encode()
        client = Client(port, reuse=True)
        while not stop.is_set():
            client.post("/tokenize", body)
            with lock:
                done[0] += 1
        client.close()

    threads = [threading.Thread(target=streams, args=(MODELS[i % 2],), daemon=True)
               for i in range(16)]  # fmt: skip
    threads += [threading.Thread(target=tokenize, args=(MODELS[i % 2],), daemon=True)
                for i in range(4)]  # fmt: skip
    for thread in threads:
        thread.start()
    threading.Timer(seconds, stop.set).start()
    return stop, threads, done


def measure(mode: str, procs: dict[str, Proc], port: int, seconds: float, table: Table) -> None:
    idle = rss_samples(procs, 1.0, 0.1)
    stop, threads, done = load(port, seconds)
    busy = rss_samples(procs, seconds, 0.1)
    stop.set()
    for thread in threads:
        thread.join(60)
    time.sleep(3)
    after = rss_samples(procs, 1.0, 0.1)
    rate = done[0] / seconds
    for name in procs:
        table.add(mode, name, common.mib(common.median(idle[name])),
                  common.mib(common.median(busy[name])), common.mib(max(busy[name])),
                  common.mib(common.median(after[name])), f"{rate:.0f}")  # fmt: skip


def warm(router_url_proc: Proc) -> None:
    for model in MODELS:
        common.load_by_request(router_url_proc, model)


def embedded(work: Path, ini: Path, seconds: float, table: Table) -> None:
    with Processes(work) as procs:
        serve = common.start_routerpanel(procs, ini, 2, name="serve")
        warm(serve)
        measure("embedded", {"serve (web + router)": serve}, serve.port or 0, seconds, table)


@contextlib.contextmanager
def team_services() -> Iterator[tuple[str, str] | None]:
    """A throw-away PostgreSQL database and a Redis database, or None when either is missing."""
    try:
        import psycopg
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except Exception as exc:  # any missing piece: team mode is skipped, with the reason
        print(f"team mode skipped: {exc}", file=sys.stderr)
        yield None
        return
    name = f"rp_bench_{uuid.uuid4().hex[:10]}"
    redis_url = REDIS_URL.rsplit("/", 1)[0] + f"/{random.randint(1, 14)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        redis.Redis.from_url(redis_url).flushdb()
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, redis_url
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def team(work: Path, ini: Path, seconds: float, table: Table) -> str | None:
    """Measure team mode; return why it was not measured, or None."""
    with team_services() as services:
        if services is None:
            return "PostgreSQL or Redis is not reachable on 127.0.0.1"
        with Processes(work) as procs:
            try:
                router, web = common.start_team(procs, ini, 2, *services)
            except RuntimeError as exc:
                print(f"team mode did not start: {exc}", file=sys.stderr)
                return "runrouter/serve --no-router did not start (see stderr)"
            warm(web)
            sampled = {"runrouter": router, "serve --no-router (web)": web}
            measure("team", sampled, web.port or 0, seconds, table)
    return None


def run(seconds: float = 10.0) -> list[Table]:
    table = Table(
        "RouterPanel's own memory (RSS MiB, children not counted)",
        ["mode", "process", "idle", "load median", "load peak", "idle after", "requests/s"],
    )
    with common.workdir("memory") as work:
        ini = work / "sim.ini"
        ini.write_text(common.sim_ini(MODELS))
        embedded(work, ini, seconds, table)
        if (why := team(work, ini, seconds, table)) is not None:
            table.notes.append(f"Team mode not measured: {why}.")
    table.notes.append(
        f"Load: {seconds:g} s of 16 concurrent streamed 64-token chats and 4 /tokenize loops "
        "against two simulated children; requests/s counts both kinds."
    )
    return [table]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of load (10)")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    common.report(run(args.seconds), args.out)


if __name__ == "__main__":
    main()
