"""Ten thousand presets: import, start-up, ``/v1/models``, the dashboard and serve's memory.

    .venv/bin/python bench/presets10k.py [--presets 10000] [--before DIR] [--out FILE]

One ``manage.py serve --models-preset FILE`` per tree with a fresh data dir, ``FILE`` holding
``--presets`` simulated models. ``--before DIR``: a checkout of the code before a change (``git
worktree add DIR REV``); both trees are measured in this run, one after the other, on the same
file, with this tree's interpreter. Figures, per tree:

* import — ``manage.py import_presets FILE`` into an empty data dir (the CLI a team would use);
* start-up — spawn of ``serve --models-preset FILE`` until ``/v1/models`` lists them (it imports
  the file again: every preset is compared with the database);
* ``/v1/models`` — 30 GETs on one connection: median and p95, and the body's size;
* dashboard — headless Chromium (Debian's, through Playwright): navigation to the first model
  card painted, the HTML's size, and the largest WebSocket frame the page received in 3 s;
* ``/presets/`` — the page's size and time;
* memory — serve's RSS once started, and its growth over the same serve with 10 presets.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from bench import common
from bench.common import Table

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]


def preset_file(path: Path, count: int) -> Path:
    names = [f"team/model-{n:05d}:Q4_K_M" for n in range(count)]
    path.write_text(common.sim_ini(names))
    return path


def timed_get(port: int, path: str, cookie: str = "", count: int = 1) -> tuple[list[float], int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    times, size = [], 0
    try:
        for _ in range(count):
            start = time.perf_counter()
            conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
            response = conn.getresponse()
            body = response.read()
            times.append(time.perf_counter() - start)
            assert response.status == 200, (path, response.status, body[:200])
            size = len(body)
    finally:
        conn.close()
    return times, size


def start(procs: common.Processes, tree: Path, ini: Path, name: str) -> tuple[common.Proc, float]:
    data = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=procs.workdir))
    port = common.free_port()
    argv = [common.PYTHON, str(tree / "manage.py"), "serve", "--models-preset", str(ini)]
    argv += ["--models-max", "2", "--port", str(port)]
    env = {"ROUTERPANEL_DATA_DIR": str(data), "ROUTERPANEL_ADMIN_PASSWORD": "bench-only"}
    began = time.perf_counter()
    proc = procs.start(name, argv, env=env, port=port, cwd=tree)
    common.wait_until(
        lambda: common.get_json(proc.url, "/v1/models", timeout=120)["data"], 300, name, proc
    )
    return proc, time.perf_counter() - began


def import_seconds(tree: Path, ini: Path, work: Path) -> float:
    data = Path(tempfile.mkdtemp(prefix="import-", dir=work))
    env = {**os.environ, "ROUTERPANEL_DATA_DIR": str(data)}
    manage = [common.PYTHON, str(tree / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], cwd=tree, env=env, check=True, timeout=600)
    began = time.perf_counter()
    subprocess.run([*manage, "import_presets", str(ini)], cwd=tree, env=env, check=True,
                   timeout=1200, stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - began


def dashboard(url: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-gpu"])  # fmt: skip
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        page.set_default_timeout(300_000)
        page.goto(f"{url}/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "bench-only")
        page.click("button[type=submit]")
        page.wait_for_selector(".model-card")
        frames: list[int] = []
        page.on("websocket", lambda ws: ws.on("framereceived", lambda p: frames.append(len(p))))
        began = time.perf_counter()
        page.goto(f"{url}/")
        page.wait_for_selector(".model-card")
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => r(true)))")
        painted = time.perf_counter() - began
        try:  # the live view has its snapshot (it never does once a frame is over the limit)
            page.wait_for_function("window.panelLive && window.panelLive.snapshots > 0",
                                   timeout=10_000)  # fmt: skip
            live = time.perf_counter() - began
        except Exception:
            live = None
        page.wait_for_timeout(3000)  # a benchmark window for frames, not a wait for state
        cookie = "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())
        browser.close()
    return {"painted": painted, "live": live, "frame": max(frames, default=0), "cookie": cookie}


def measure(tree: Path, label: str, ini: Path, small: Path, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"tree": label}
    out["import"] = import_seconds(tree, ini, work)
    with common.Processes(work) as procs:
        base, _ = start(procs, tree, small, f"{label}-10")
        base_rss = psutil.Process(base.pid).memory_info().rss
        procs.stop(base)
        serve, out["startup"] = start(procs, tree, ini, label)
        out["rss"] = psutil.Process(serve.pid).memory_info().rss
        out["growth"] = out["rss"] - base_rss
        port = serve.port or 0
        times, out["models_bytes"] = timed_get(port, "/v1/models", count=30)
        out["models_median"], out["models_p95"] = statistics.median(times), common.p95(times)
        shown = dashboard(serve.url)
        out |= {k: shown[k] for k in ("painted", "live", "frame")}
        out["html"] = timed_get(port, "/", shown["cookie"])[1]
        times, out["presets_bytes"] = timed_get(port, "/presets/", shown["cookie"], count=3)
        out["presets_median"] = statistics.median(times)
        out["rss_after"] = psutil.Process(serve.pid).memory_info().rss
    return out


def run(presets: int = 10_000, before: Path | None = None) -> list[Table]:
    with tempfile.TemporaryDirectory(prefix="presets10k-") as tmp:
        work = Path(tmp)
        ini = preset_file(work / "big.ini", presets)
        small = preset_file(work / "small.ini", 10)
        trees = ([(before, "before")] if before else []) + [(ROOT, "after" if before else "now")]
        results = [measure(tree, label, ini, small, work) for tree, label in trees]
    table = Table(f"{presets:,} presets", ["figure", *[r["tree"] for r in results]])
    rows = [
        ("import_presets (s)", "import", lambda v: f"{v:.1f}"),
        ("serve start-up until /v1/models lists them (s)", "startup", lambda v: f"{v:.1f}"),
        ("/v1/models median (ms)", "models_median", common.ms),
        ("/v1/models p95 (ms)", "models_p95", common.ms),
        ("/v1/models body (MiB)", "models_bytes", common.mib),
        ("dashboard: first card painted (s)", "painted", lambda v: f"{v:.2f}"),
        (
            "dashboard: live (snapshot applied) (s)",
            "live",
            lambda v: "never (no snapshot in 10 s)" if v is None else f"{v:.2f}",
        ),
        ("dashboard HTML (MiB)", "html", common.mib),
        ("dashboard: largest WebSocket frame (bytes)", "frame", lambda v: f"{v:,}"),
        ("/presets/ median (s)", "presets_median", lambda v: f"{v:.2f}"),
        ("/presets/ HTML (MiB)", "presets_bytes", common.mib),
        ("serve RSS once started (MiB)", "rss", common.mib),
        ("… growth over 10 presets (MiB)", "growth", common.mib),
        ("serve RSS after the pages (MiB)", "rss_after", common.mib),
    ]
    for label, key, shown in rows:
        table.add(label, *[shown(r[key]) for r in results])
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", type=int, default=10_000)
    parser.add_argument("--before", type=Path, help="a checkout of the code before a change")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    common.report(run(args.presets, args.before), args.out)


if __name__ == "__main__":
    main()
