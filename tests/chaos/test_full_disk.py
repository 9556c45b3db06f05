"""A full disk under the data dir: the router keeps its promise and recovers without a restart.

The data dir is a 24 MB tmpfs this test mounts (root; ``mount -t tmpfs``): a real filesystem
that really fills, so every write the router makes there — the state file, the audit journal,
the SQLite database — fails with ENOSPC exactly as on a full disk, with no fault injected into
the code. With the disk full: an eviction and a spawn (the spawn's bookkeeping fails), then a
child killed with SIGKILL (its supervisor rewrites the state file as it reaps it). Live children
are sampled throughout (``models_max`` 1: never two), every request is answered, ``/ready`` says
what is wrong. Then the space comes back: the state file and the journal are written again and
every audit row of the outage reaches the database, with no restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.auditdb import audit_rows, wait_for_rows
from tests.support.chaos import chat, child_of, record
from tests.support.ports import free_port
from tests.support.serving import LiveChildSampler, run_manage, sim_preset, wait_until
from tests.support.tiers import missing

SIZE_MB = 24


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of SIZE_MB mounted for this test only."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        missing(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """Write a file until the disk refuses another byte; return it (delete it to free)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 512, 1):  # big blocks, then the last crumbs
            block = b"\0" * size
            try:
                while os.write(fd, block) == size:
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


def ready(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/ready", timeout=10).json())


def test_a_full_disk_never_breaks_models_max_and_it_recovers_without_a_restart(
    small_disk: Path, tmp_path: Path
) -> None:
    marker = f"disk-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text(sim_preset("a", marker) + sim_preset("b", marker))
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    env = {"ROUTERPANEL_DISK_WARN_MB": "4"}
    with (
        run_manage(args, small_disk, port=free_port(), env=env, log_dir=tmp_path) as server,
        LiveChildSampler(marker, server.process.pid) as sampler,
    ):
        url = server.url
        post = lambda model: httpx.post(f"{url}/v1/chat/completions", json=chat(model), timeout=60)  # noqa: E731
        assert post("a").status_code == 200
        assert ready(url)["status"] == "ok"
        filler = fill(small_disk)
        full_at = time.monotonic()

        # An eviction and a spawn on a full disk: a stops, b starts, never both.
        assert post("b").status_code == 200
        # A child killed under it: its exit is still seen, and b starts again on demand.
        victim = child_of(server, marker, "b")
        victim.kill()
        wait_until(lambda: not victim.is_running() or victim.status() == "zombie", 10, "b dead")
        wait_until(lambda: _state(url, "b") != "loaded", 30, "the router to see b's exit")
        # A crash so soon after its start holds b back (a crash loop); a load starts it now.
        load = httpx.post(f"{url}/models/load", json={"model": "b"}, timeout=60)
        assert load.status_code == 200, load.text
        assert post("b").status_code == 200
        assert post("a").status_code == 200  # and one more swap
        status = ready(url)
        assert status["status"] == "degraded", status
        said = " ".join(status["problems"])
        assert "could not write the state file" in said, said
        assert "could not write the audit journal" in said, said
        assert "MB free" in said, said

        filler.unlink()  # the space comes back
        freed_at = time.monotonic()
        wait_until(lambda: ready(url)["status"] == "ok", 30, "/ready to say ok again")
        recovered = time.monotonic() - freed_at
        state = json.loads((small_disk / "children.json").read_text())
        assert [c["name"] for c in state["children"]] == ["a"]  # written again, and right
        # Nothing lost: the swaps and the crash made while the disk was full are stored.
        evictions = wait_for_rows(server.data_dir, "eviction", 2)
        assert [r["model"] for r in evictions] == ["a", "b"]  # a for b, then b for a
        assert audit_rows(server.data_dir, "WHERE kind = ? AND model = ?", "crash", "b")
        disk = "the data disk refused writes for "
        outages = wait_for_rows(server.data_dir, "outage")
        wait_until(
            lambda: any(r["reason"].startswith(disk) for r in audit_rows(server.data_dir)),
            30, "the data disk's outage row",
        )  # fmt: skip
        print([r["reason"] for r in outages])
        sampler.sample_enough()
        peak, seen = sampler.saw()
        assert peak == 1 and seen == {"a", "b"}, (peak, seen)
        record(
            "data dir full (tmpfs)", full_for_s=round(freed_at - full_at, 1),
            requests_answered="all 200", peak_children=peak, models_max=1,
            recovered_after_space_back_s=round(recovered, 2), restart_needed=False,
            rows_lost=0,  # every row of the outage is asserted stored above
        )  # fmt: skip
    assert server.process.returncode == 0


def _state(url: str, model: str) -> str:
    data = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return str(next(m for m in data if m["id"] == model)["state"])


def test_fill_leaves_no_room(small_disk: Path) -> None:
    """The helper really fills the disk (else the test above would test nothing)."""
    fill(small_disk)
    with pytest.raises(OSError):
        (small_disk / "one-more").write_bytes(b"x" * 4096)
    assert os.statvfs(small_disk).f_bavail == 0
