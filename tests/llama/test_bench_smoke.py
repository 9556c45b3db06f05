"""Every benchmark part still runs: ``bench/run_all.py --quick`` on the real llama-server.

The benchmarks are not timed tests (their figures live in the README), but their code must keep
working as the code it measures changes: a stop once found ``swap.py`` failing on every spawn
since the supervisor had gained an option, months after the change. The quick run uses small
counts (its numbers mean nothing); this test only asks that each part runs to its end and
reports its tables. Team-mode rows need PostgreSQL and Redis; without them the bench says so.

The models the bench writes go to this test's own cache directory (``ROUTERPANEL_CACHE``), not
the user's; the llama-server binary and the vocab are passed in explicitly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 900.0  # seconds; about 3 minutes on 2 cores


def test_every_benchmark_part_runs_to_its_end(
    llama_server_bin: Path, vocab_gguf: Path, tmp_path: Path
) -> None:
    out = tmp_path / "quick.md"
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN": str(llama_server_bin),
        "LLAMA_VOCAB_GGUF": str(vocab_gguf),
        "ROUTERPANEL_CACHE": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "bench/run_all.py", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    report = out.read_text()
    assert "--quick run" in report
    for title in (
        "The data plane against llama.cpp's router",
        "Per-request overhead",
        "Streamed tokens per second",
    ):
        assert title in report, title
    for part in ("proxy", "swap", "scale", "memory", "panel", "burst"):
        assert f"== {part} done in" in done.stderr, part  # run_all's line after each part
