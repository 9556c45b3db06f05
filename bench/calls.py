"""How much code one request runs in ``serve``: function calls per request, counted, not timed.

    .venv/bin/python bench/calls.py [--requests 200] [--out FILE]

floor.py shows that what ours adds to a request grows when the request finds the router cold
(other processes ran on its core in between): the more code and data one request touches, the
more of it must come back into the caches. Timings of that are noisy on a shared 2-core machine;
a count is not. This part starts ``serve`` on Daphne and on uvicorn, each with the tiny model
loaded on a real llama-server, under a small launcher (``--serve``) that counts every Python
and C function call in the server's event-loop thread between two signals. It sends
``/tokenize`` requests on a kept-alive connection and on a new connection per request, and
prints per request:

* Python calls and C calls (builtins and methods of C types), all areas together;
* Python calls by area: the engine (routerpanel/router), the API and the bridge (models_app,
  but for the server adapters), the HTTP server (uvicorn, or Daphne and Twisted, with our
  adapters for each), Django and Channels, the standard library (asyncio and the rest);
* distinct Python functions that ran on every request.

The same code and requests give the same counts to within a call or two (a background task,
such as the memory sampler, may run once in a window). Use it to compare two versions of the
code, next to the timings of floor.py and run_all.py.
"""

from __future__ import annotations

import argparse
import collections
import os
import runpy
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, proxy
from bench.common import Client, Processes, Table

MODEL = "tiny"
WARMUP = 100
AREAS = ("engine", "API and bridge", "HTTP server", "Django and Channels", "stdlib", "other")
SERVER_ADAPTERS = (
    "/servers/uvicorn_server.py",
    "/servers/daphne_server.py",
    "/servers/daphne_connection.py",
    "/servers/daphne_guard.py",
    "/servers/daphne_writes.py",
    "routerpanel/reactor.py",
)


# ---- the launcher: counts in the served process ----------------------------------------------


def area(filename: str) -> str:
    path = filename.replace(os.sep, "/")
    if "/routerpanel/router/" in path:
        return "engine"
    if path.endswith(SERVER_ADAPTERS) or any(
        f"/{name}/" in path for name in ("uvicorn", "daphne", "twisted", "httptools", "autobahn")
    ):
        return "HTTP server"
    if "/models_app/" in path or "/routerpanel/" in path:
        return "API and bridge"
    if any(f"/{name}/" in path for name in ("django", "channels", "asgiref")):
        return "Django and Channels"
    if "site-packages" not in path and (path.startswith(sys.base_prefix) or path.startswith("<")):
        return "stdlib"
    return "other"


def serve(out: Path, argv: list[str]) -> None:
    """Run ``argv`` (``manage.py serve ...``) in this process; SIGUSR1 starts counting the
    main thread's calls, SIGUSR2 stops and writes them to ``out`` (tab-separated)."""
    calls: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            calls["py", code.co_filename, f"{code.co_name}:{code.co_firstlineno}"] += 1
        elif event == "c_call":
            calls["c", "", getattr(arg, "__qualname__", "?")] += 1

    def start(*_: object) -> None:
        calls.clear()
        sys.setprofile(count)

    def stop(*_: object) -> None:
        sys.setprofile(None)
        lines = [f"{n}\t{kind}\t{where}\t{name}\n" for (kind, where, name), n in calls.items()]
        out.write_text("".join(lines))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


# ---- measuring --------------------------------------------------------------------------------


def counted(proc: common.Proc, out: Path, reuse: bool, requests: int) -> dict[str, float]:
    body = proxy.payload("/tokenize", MODEL)
    client = Client(proc.port or 0, reuse=reuse)
    try:
        for _ in range(WARMUP):
            client.post("/tokenize", body)
        out.unlink(missing_ok=True)
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.2)  # the handler runs between two of the loop's steps
        for _ in range(requests):
            _, status, answer = client.post("/tokenize", body)
            if status != 200:
                raise RuntimeError(f"{proc.name} answered {status}: {answer[:300]!r}")
        time.sleep(0.05)
        os.kill(proc.pid, signal.SIGUSR2)
        common.wait_until(out.exists, 10, f"{proc.name}'s counts", proc)
    finally:
        client.close()
    return summary(out.read_text(), requests)


def summary(text: str, requests: int) -> dict[str, float]:
    got: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        n, kind, where, _ = line.split("\t")
        if kind == "c":
            got["C calls"] += int(n)
            continue
        got["Python calls"] += int(n)
        got[area(where)] += int(n)
        if int(n) >= requests:
            got["functions"] += requests  # divided by requests below: one per function
    return {k: v / requests for k, v in got.items()}


def run(requests: int) -> Table:
    table = Table(
        f"Calls per /tokenize in serve's event-loop thread ({requests} requests per row)",
        ["server", "connection", "Python calls", "C calls", *AREAS, "functions on every request"],
    )
    with common.workdir("calls") as work, Processes(work) as procs:
        ini = work / "calls.ini"
        ini.write_text(common.preset_ini({MODEL: common.tiny_models()[MODEL]}))
        server_bin = common.llama_server_bin()
        for label, http in (("Daphne", "daphne"), ("uvicorn", "uvicorn")):
            out = work / f"{http}.calls"
            launcher = [common.PYTHON, __file__, "--serve", str(out), "--"]
            proc = common.start_routerpanel(
                procs, ini, 2, server_bin=server_bin, name=f"routerpanel-{http}",
                env={"ROUTERPANEL_HTTP": http}, launcher=launcher,
            )  # fmt: skip
            common.load_by_request(proc, MODEL)
            for reuse in (True, False):
                got = counted(proc, out, reuse, requests)
                cells = [f"{got.get(name, 0.0):.1f}" for name in ("Python calls", "C calls")]
                cells += [f"{got.get(name, 0.0):.1f}" for name in AREAS]
                cells.append(f"{got.get('functions', 0.0):.0f}")
                table.add(label, "reuse" if reuse else "new", *cells)
            procs.stop(proc)
    table.notes.append(
        "Calls counted with sys.setprofile in the thread that runs the event loop, from the "
        "first request of the row to shortly after its last, divided by the requests. Areas "
        "split the Python calls by the file of the function called; the HTTP server includes "
        "our adapters to it (daphne_*.py, uvicorn_server.py, reactor.py)."
    )
    return table


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:  # --serve COUNTS -- manage.py serve ...
        serve(Path(argv[1]), argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per row (200)")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    common.report([run(args.requests)], args.out)


if __name__ == "__main__":
    main()
