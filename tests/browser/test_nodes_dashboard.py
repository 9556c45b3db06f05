"""One dashboard for two router nodes (issue 18.5): node health in the header, cards grouped by
the node their model runs on, a node lost within seconds of its router's kill -9.

Two ``runrouter --node`` processes and a ``serve --no-router`` on a PostgreSQL database and a
``redis-server`` of the test's own (tests/support/nodes.py), simulated children.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.browser import Console, screenshot, sign_in
from tests.support.nodes import chat, cluster, own_redis
from tests.support.serving import sim_preset

ADMIN_PASSWORD = "test-only-password"  # what run_manage gives the first admin

HEADS = "() => [...document.querySelectorAll('#cards .node-head')].map((h) => h.textContent)"


def test_the_dashboard_groups_two_nodes_and_shows_one_lost(
    new_page: Callable[..., tuple[Any, Console]],
    tmp_path: Path,
    pg_database: str,
) -> None:
    marker = f"nodes-ui-{tmp_path.name}"
    presets = "".join(sim_preset(name, marker) for name in ("alpha", "beta", "gamma"))
    with (
        own_redis(tmp_path / "redis") as redis,
        cluster(tmp_path, pg_database, redis, presets) as nodes,
    ):
        with httpx.Client(base_url=nodes.web.url, timeout=60) as client:
            for model in ("alpha", "beta"):  # one on each node: a free slot first
                assert client.post("/v1/chat/completions", json=chat(model)).status_code == 200
        where = {m: str(nodes.node_of(m)) for m in ("alpha", "beta")}
        assert set(where.values()) == {"studio-1", "studio-2"}
        page, console = new_page()
        sign_in(page, nodes.web, "admin", ADMIN_PASSWORD)
        page.wait_for_selector("#nodes li.node-live >> nth=1")
        assert page.locator("#nodes li").all_inner_texts()[0].startswith("studio-1")
        page.wait_for_function(f"({HEADS})().length === 3")
        assert page.evaluate(HEADS) == ["studio-1", "studio-2", "Not running"]
        assert page.locator("#slots").inner_text() == "2 of 2 running"  # both nodes' slots
        for model, node in where.items():
            flag = page.locator(f'.model-card[data-model="{model}"] [data-field=node]')
            assert flag.inner_text() == f"⌂ on {node}"
        assert page.locator('.model-card[data-model="gamma"] [data-field=node]').is_hidden()
        screenshot(page, "nodes-dashboard.png")
        # kill -9 the router of alpha's node: the header says lost within DEAD_AFTER (6 s).
        lost = where["alpha"]
        nodes.routers[lost].process.send_signal(signal.SIGKILL)
        nodes.routers[lost].process.wait(10)
        page.wait_for_selector(f'#nodes li.node-lost[data-node="{lost}"]', timeout=15_000)
        text = page.locator(f'#nodes li[data-node="{lost}"]').inner_text()
        assert "lost" in text, text
        flag = page.locator('.model-card[data-model="alpha"] [data-field=node]')
        page.wait_for_function(
            "(el) => el.textContent.includes('lost')", arg=flag.element_handle()
        )  # alpha ran on the lost node: its card says so, under that node's heading
        assert flag.inner_text() == f"⌂ on {lost}, lost"
        assert page.locator("#slots").inner_text() == "1 of 1 running"  # the live node's slot
        screenshot(page, "nodes-lost.png")
        console.assert_clean()
