"""Every benchmark part still runs: ``bench/run_all.py --quick`` on the real llama-server.

The benchmarks are not timed tests (their figures live in docs/benchmarks.md), but their code must
keep working as the code it measures changes: a stop once found ``swap.py`` failing on every spawn
since the supervisor had gained an option, months after the change. The quick run uses small
counts (its numbers mean nothing); this test only asks that each part runs to its end and
reports its tables. Team-mode rows need PostgreSQL and Redis; without them the bench says so.

The models the bench writes go to this test's own cache directory (``ROUTERPANEL_CACHE``), not
the user's; the llama-server binary and the vocab are passed in explicitly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 900.0  # seconds; about 3 minutes on 2 cores
FIGURE = r"[+-]\d+\.\d\d \(-?\d+\.\d\d\)"  # added ms (÷ llama.cpp's router's)


@pytest.fixture(autouse=True)
def own_redis(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's team-mode rows use this worker's own Redis, never the machine's."""
    monkeypatch.setenv("ROUTERPANEL_TEST_REDIS", redis_url)


def bench(
    args: list[str], llama_server_bin: Path, vocab_gguf: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<args>`` with this test's binary, vocab and cache; it must exit 0."""
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN": str(llama_server_bin),
        "LLAMA_VOCAB_GGUF": str(vocab_gguf),
        "ROUTERPANEL_CACHE": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done


def test_every_benchmark_part_runs_to_its_end(
    llama_server_bin: Path, vocab_gguf: Path, tmp_path: Path
) -> None:
    out = tmp_path / "quick.md"
    args = ["bench/run_all.py", "--quick", "--out", str(out)]
    done = bench(args, llama_server_bin, vocab_gguf, tmp_path)
    report = out.read_text()
    assert "--quick run" in report
    for title in (
        "The data plane against llama.cpp's router",
        "Per-request overhead",
        "Streamed tokens per second",
        "Calls per /tokenize",
    ):
        assert title in report, title
    calls = [line for line in report.splitlines() if line.startswith(("| Daphne", "| uvicorn"))]
    assert len(calls) == 4, report  # two servers, two kinds of connection
    for row in calls:  # every area the request crosses was counted
        python, _, engine, api, server = (float(c) for c in row.strip("|").split("|")[2:7])
        assert python > 100 and engine > 10 and api > 10 and server > 10, row
    for part in ("proxy", "calls", "swap", "scale", "memory", "panel", "burst"):
        assert f"== {part} done in" in done.stderr, part  # run_all's line after each part


def test_the_hot_and_cold_part_runs_to_its_end(
    llama_server_bin: Path, vocab_gguf: Path, tmp_path: Path
) -> None:
    """bench/floor.py is not part of run_all (its own command): a few requests per row, and
    every row of its table has a figure for each of the four routers."""
    out = tmp_path / "floor.md"
    bench(["bench/floor.py", "--requests", "30", "--out", str(out)], llama_server_bin,
          vocab_gguf, tmp_path)  # fmt: skip
    rows = [line for line in out.read_text().splitlines() if line.startswith(("| reuse", "| new"))]
    assert len(rows) == 4, out.read_text()
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")][2:]
        assert len(cells) == 4 and all(re.fullmatch(FIGURE, cell) for cell in cells), row
