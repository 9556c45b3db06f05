"""Several hosts on one machine (issue 18): two ``runrouter --node`` processes and a web process.

The two nodes advertise 127.0.0.2 and 127.0.0.3 (both loopback, both local): their children
listen there and the web process proxies to them there. PostgreSQL holds the presets and the
audit log; a ``redis-server`` of the test's own carries the channel layer, the heartbeats and
the node directory. Simulated llama-servers are the children.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.nodes import ADDRESSES, Cluster, chat, cluster, own_redis
from tests.support.redis_server import RedisServer
from tests.support.serving import (
    ROOT,
    LiveChildSampler,
    StreamReader,
    in_threads,
    sim_preset,
    simserver_processes,
    wait_until,
)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with own_redis(tmp_path / "redis") as server:
        yield server


def test_requests_are_placed_per_node_and_each_node_keeps_its_own_models_max(
    tmp_path: Path, pg_database: str, redis: RedisServer
) -> None:
    marker = f"nodes-{tmp_path.name}"
    presets = "".join(sim_preset(name, marker, load_ms=100) for name in "abc")
    with cluster(tmp_path, pg_database, redis, presets) as nodes:
        with (
            children_sampled(nodes, marker) as samplers,
            httpx.Client(base_url=nodes.web.url, timeout=90) as client,
        ):
            assert client.post("/v1/chat/completions", json=chat("a")).status_code == 200
            first = nodes.node_of("a")
            assert client.post("/v1/chat/completions", json=chat("b")).status_code == 200
            second = nodes.node_of("b")
            print(f"placement: a on {first}, b on {second}")
            assert {first, second} == set(ADDRESSES)  # a free slot first: the other node
            for _ in range(3):  # a request goes where its model is loaded
                assert client.post("/v1/chat/completions", json=chat("a")).status_code == 200
                assert nodes.node_of("a") == first
            # Each node has one slot: c goes to the node with the most memory left (on one
            # machine, a coin toss) and evicts what ran there; the other node keeps its.
            assert client.post("/v1/chat/completions", json=chat("c")).status_code == 200
            models = nodes.models()
            evicted, kept = ("a", "b") if models["c"]["node"] == first else ("b", "a")
            assert models[evicted]["state"] == "unloaded", models[evicted]
            assert models[kept]["state"] == "loaded", models[kept]
            assert models[kept]["node"] == {"a": first, "b": second}[kept]
            # Concurrent requests for all three never run two children on one node.
            results: list[int] = []

            def ask(model: str) -> None:
                answer = client.post("/v1/chat/completions", json=chat(model))
                results.append(answer.status_code)
                if answer.status_code != 200:
                    print(f"{model}: {answer.status_code} {answer.text}")

            in_threads(ask, "abcabc")
            assert results == [200] * 6
        one_child_at_a_time(samplers)
        # The children listen on their node's advertised address, and the web process reached
        # them there.
        for name, address in ADDRESSES.items():
            for cmdline in nodes.children(name, marker):
                assert cmdline[cmdline.index("--host") + 1] == address, cmdline


@contextmanager
def children_sampled(nodes: Cluster, marker: str) -> Iterator[dict[str, LiveChildSampler]]:
    """Each node's live children, sampled while the block runs (node name -> sampler)."""
    samplers = {n: LiveChildSampler(marker, s.process.pid) for n, s in nodes.routers.items()}
    with ExitStack() as sampling:
        for sampler in samplers.values():
            sampling.enter_context(sampler)
        yield samplers


def one_child_at_a_time(samplers: dict[str, LiveChildSampler]) -> set[str]:
    """Assert that no node (``--models-max 1``) ran two children; return every model seen."""
    models: set[str] = set()
    for name, sampler in samplers.items():
        peak, seen = sampler.saw()
        print(f"{name}: at most {peak} child(ren), models {sorted(seen)}")
        assert peak == 1, f"{name} ran {peak} children with models_max 1"
        models |= seen
    return models


def test_a_lost_node_is_seen_within_10_s_its_models_move_and_it_rejoins(
    tmp_path: Path, pg_database: str, redis: RedisServer
) -> None:
    marker = f"loss-{tmp_path.name}"
    presets = sim_preset("a", marker) + sim_preset("b", marker)
    with (
        cluster(tmp_path, pg_database, redis, presets) as nodes,
        httpx.Client(base_url=nodes.web.url, timeout=60) as client,
    ):
        assert client.post("/v1/chat/completions", json=chat("a")).status_code == 200
        home = str(nodes.node_of("a"))
        other = next(n for n in ADDRESSES if n != home)
        router = nodes.routers[home]
        orphan = simserver_processes(marker, router.process.pid)
        assert len(orphan) == 1
        assert orphan[0].is_running()
        router.process.send_signal(signal.SIGKILL)
        router.process.wait(10)
        killed = time.monotonic()
        with ThreadPoolExecutor(1) as pool:  # sent at once: placed on the node just killed
            early = pool.submit(client.post, "/v1/chat/completions", json=chat("a"))
            # Lost once its heartbeat is DEAD_AFTER (6 s) old; the deadline leaves a busy
            # machine room, and the figure is printed, not judged.
            wait_until(lambda: nodes.nodes_seen().get(home) == "lost", 30, f"{home} lost")
            lost_after = time.monotonic() - killed
            response = early.result(timeout=60)
            moved_after = time.monotonic() - killed
        print(f"{home} lost after {lost_after:.1f} s; the request sent at the kill was served "
              f"on {other} after {moved_after:.1f} s")  # fmt: skip
        assert response.status_code == 200, response.text
        assert nodes.node_of("a") == other
        assert client.post("/v1/chat/completions", json=chat("a")).status_code == 200
        # Its child saw stdin close (llama.cpp's rule for a router's children) and left; a
        # child that did not would be killed as a leftover when the node returns.
        wait_until(lambda: not orphan[0].is_running(), 15, "the orphaned child to exit")
        nodes.start_node(home)  # the node returns on its data dir and rejoins
        wait_until(lambda: nodes.nodes_seen().get(home) == "live", 15, f"{home} live")
    rows = _audit(pg_database, "node_lost", "node_joined")
    assert [r for r in rows if r[0] == "node_lost" and r[1] == home], rows
    assert [r for r in rows if r[0] == "node_joined" and r[1] == home], rows


def test_one_router_per_node_name(tmp_path: Path, pg_database: str, redis: RedisServer) -> None:
    marker = f"name-{tmp_path.name}"
    with cluster(tmp_path, pg_database, redis, sim_preset("a", marker)) as nodes:
        env = {**os.environ, **nodes.env, "ROUTERPANEL_DATA_DIR": str(tmp_path / "again")}
        again = subprocess.run(
            [sys.executable, "manage.py", *nodes.node_args("studio-1")],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert again.returncode != 0
        assert "node studio-1" in again.stderr, again.stderr


def _audit(database: str, *kinds: str) -> list[tuple[str, str, str]]:
    import psycopg

    with psycopg.connect(database) as db:
        rows = db.execute(
            "SELECT kind, node, reason FROM models_app_auditevent WHERE kind = ANY(%s) ORDER BY id",
            (list(kinds),),
        ).fetchall()
    return [tuple(r) for r in rows]


def test_children_of_keyed_nodes_refuse_anyone_but_the_router_and_the_web(
    tmp_path: Path, pg_database: str, redis: RedisServer
) -> None:
    """--child-keys on (auto turns it on off loopback): each spawn gets a fresh key that the
    web process sends; a client on the network reaching the child directly gets 401."""
    marker = f"keys-{tmp_path.name}"
    presets = sim_preset("a", marker) + sim_preset("b", marker)
    with cluster(tmp_path, pg_database, redis, presets, "--child-keys", "on") as nodes:
        with httpx.Client(base_url=nodes.web.url, timeout=60) as client:
            for model in "ab":
                answer = client.post("/v1/chat/completions", json=chat(model))
                assert answer.status_code == 200, answer.text
        for name, address in ADDRESSES.items():
            (cmdline,) = nodes.children(name, marker)
            assert "--api-key" not in cmdline  # the key is in a 0600 file, not in ps
            port = cmdline[cmdline.index("--port") + 1]
            url = f"http://{address}:{port}/v1/chat/completions"
            direct = httpx.post(url, json=chat("a"), timeout=10)
            print(f"{name}: a direct request to its child answered {direct.status_code}")
            assert direct.status_code == 401, direct.text
            assert direct.json()["error"]["type"] == "authentication_error"


def test_a_burst_over_two_nodes_is_answered_whole_and_each_node_keeps_its_slot(
    tmp_path: Path, pg_database: str, redis: RedisServer
) -> None:
    """200 concurrent chats over three models, two nodes of one slot each: every one 200, and
    neither node ever runs a second child (the placement swaps while the rest wait)."""
    marker = f"burst-{tmp_path.name}"
    presets = "".join(sim_preset(name, marker, load_ms=50) for name in "abc")
    with cluster(tmp_path, pg_database, redis, presets) as nodes:
        with children_sampled(nodes, marker) as samplers:
            started = time.monotonic()
            statuses = asyncio.run(_burst(nodes.web.url, ["abc"[i % 3] for i in range(200)]))
            took = time.monotonic() - started
        print(f"200 concurrent chats over 2 nodes: {dict(statuses)} in {took:.1f} s")
        assert statuses == {200: 200}, statuses
        assert one_child_at_a_time(samplers) == set("abc")
        assert nodes.nodes_seen() == dict.fromkeys(ADDRESSES, "live")


async def _burst(url: str, models: list[str]) -> Counter[int]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one(model: str) -> int:
            answer = await client.post("/v1/chat/completions", json=chat(model))
            if answer.status_code != 200:
                print(f"{model}: {answer.status_code} {answer.text[:300]}")
            return answer.status_code

        return Counter(await asyncio.gather(*(one(m) for m in models)))


def test_two_nodes_outlive_a_redis_outage_and_the_directory_heals(
    tmp_path: Path, pg_database: str, redis: RedisServer
) -> None:
    """Redis (the node directory, heartbeats, events) goes away for 3 s under two nodes: no
    request gets a 500 or hangs, no router exits, and once Redis is back both nodes are seen
    live again and serve their models."""
    marker = f"redis-{tmp_path.name}"
    presets = sim_preset("a", marker) + sim_preset("b", marker)
    with (
        cluster(tmp_path, pg_database, redis, presets) as nodes,
        httpx.Client(base_url=nodes.web.url, timeout=30) as client,
    ):
        for model in "ab":
            assert client.post("/v1/chat/completions", json=chat(model)).status_code == 200
        redis.kill()
        killed = time.monotonic()
        during: list[tuple[str, int, float]] = []
        while time.monotonic() - killed < 3.0:
            for model in "ab":
                t0 = time.monotonic()
                try:
                    status = client.post("/v1/chat/completions", json=chat(model)).status_code
                except httpx.HTTPError:
                    status = 0  # no answer at all
                during.append((model, status, time.monotonic() - t0))
            time.sleep(0.2)
        redis.start()
        back = time.monotonic()
        wait_until(lambda: nodes.nodes_seen() == dict.fromkeys(ADDRESSES, "live"), 20, "2 nodes")
        seen_after = time.monotonic() - back
        for model in "ab":
            served = client.post("/v1/chat/completions", json=chat(model))
            assert served.status_code == 200, served.text
        served_after = time.monotonic() - back
        statuses = Counter(status for _, status, _ in during)
        print(f"during the outage: {dict(statuses)}, slowest {max(t for *_, t in during):.2f} s; "
              f"both nodes live {seen_after:.1f} s and both models served {served_after:.1f} s "
              "after Redis returned")  # fmt: skip
        assert set(statuses) <= {200, 503}, during  # never a 500, never a dropped connection
        assert all(took < 10 for *_, took in during), during
        for name, router in nodes.routers.items():
            assert router.process.poll() is None, f"{name} exited: {router.output()[-2000:]}"


def test_a_hung_child_on_a_node_is_killed_and_the_stream_through_the_web_says_why(
    tmp_path: Path, pg_database: str, redis: RedisServer
) -> None:
    """A child on a node stops answering mid-stream (SIGSTOP): that node's watchdog kills it
    within its hang-timeout, the client streaming through the web process gets one SSE error
    event naming the cause (not a cut connection), and the model is served again."""
    marker = f"hung-{tmp_path.name}"
    presets = sim_preset("a", marker, token_ms=50, extra="hang-timeout = 2\nsim-tokens = 400\n")
    with cluster(tmp_path, pg_database, redis, presets) as nodes:
        url = f"{nodes.web.url}/v1/chat/completions"
        with StreamReader(url, {**chat("a", 400), "stream": True}) as streamed:
            streamed.wait_started()
            home = str(nodes.node_of("a"))
            (child,) = simserver_processes(marker, nodes.routers[home].process.pid)
            os.kill(child.pid, signal.SIGSTOP)
            stopped = time.monotonic()
        assert streamed.status == 200 and streamed.ended_at is not None
        took = streamed.ended_at - stopped
        errors = streamed.errors()
        print(f"the stream ended {took:.1f} s after its child on {home} hung: {errors}")
        assert len(errors) == 1, streamed.lines[-3:]
        assert errors[0]["error"]["code"] == 503
        message = errors[0]["error"]["message"]
        assert "model name=a stopped responding" in message
        assert message.endswith("a request starts it again after a back-off of 1 s")  # up < 60 s
        assert took < 10
        wait_until(lambda: not child.is_running() or child.status() == "zombie", 10, "the kill")
        # As the stream was told: the next start waits out the back-off (a 503 that says so),
        # then the model is served again.
        answers: list[int] = []

        def served() -> bool:
            answers.append(httpx.post(url, json=chat("a"), timeout=60).status_code)
            return answers[-1] == 200

        wait_until(served, 15, "a served again")
        print(f"answers until served again: {answers}")
        assert set(answers) <= {200, 503}, answers
    rows = _audit(pg_database, "hung")
    assert [r for r in rows if r[1] == home], rows
