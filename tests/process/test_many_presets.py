"""A real ``serve --models-preset`` with 3,000 presets (issue 45.3): the dashboard's socket goes
live with a bounded snapshot, ``/v1/models`` lists them all, the pages page.

Past about 1,600 presets the whole snapshot was larger than Daphne's 1 MiB frame: the socket
was refused it (PayloadExceededError) and the page never went live. The figures at 10,000 are
bench/presets10k.py's."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.live_sockets import login, next_of, open_socket
from tests.support.ports import free_port
from tests.support.serving import run_manage, sim_preset

ADMIN_PASSWORD = "test-only-password"  # run_manage's ROUTERPANEL_ADMIN_PASSWORD
COUNT = 3_000


@pytest.mark.http_server
@pytest.mark.parametrize("http", ["daphne", "uvicorn"])
def test_three_thousand_presets_go_live_with_a_bounded_snapshot(http: str, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex[:8]
    ini = tmp_path / "many.ini"
    ini.write_text("\n".join(sim_preset(f"team/m-{n:05d}", marker) for n in range(COUNT)))
    args = ["serve", "--models-preset", str(ini), "--http", http]
    with run_manage(args, tmp_path / "data", port=free_port(), timeout=120) as server:
        listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
        assert len(listed) == COUNT
        cookies = login(server.url, "admin", ADMIN_PASSWORD)

        async def first_snapshot() -> tuple[dict[str, Any], int]:
            ws = await open_socket(server.url, cookies)
            try:
                message = await next_of(ws, "snapshot")
            finally:
                await ws.close()
            return message, len(json.dumps(message))

        message, size = asyncio.run(first_snapshot())
        snap = message["snapshot"]
        print(f"{http}: the snapshot of {COUNT} presets took {size:,} bytes")
        assert snap["counts"]["models"] == COUNT and len(snap["models"]) == 48
        assert size < 256 * 1024  # the frame limit is 1 MiB; the whole one was ~1.9 MB here

        with httpx.Client(base_url=server.url, cookies=cookies, timeout=30) as client:
            page = client.get("/?q=m-0299").text
            shown = re.findall(r'class="model-card[^"]*" data-model="([^"]+)"', page)
            assert shown == [f"team/m-{n:05d}" for n in range(2990, 3000)]
            assert "1–100 of 3000 · page 1 of 30" in client.get("/presets/").text
