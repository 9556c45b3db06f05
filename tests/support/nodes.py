"""Several hosts on one machine (issue 18), for the services and browser tiers: two
``runrouter --node`` processes advertising 127.0.0.2 and 127.0.0.3 (both loopback, both local)
and a ``serve --no-router``, on a PostgreSQL database and a ``redis-server`` of the test's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.redis_server import RedisServer, redis_server_available
from tests.support.serving import Server, run_manage, simserver_processes, wait_until
from tests.support.tiers import missing

ADDRESSES = {"studio-1": "127.0.0.2", "studio-2": "127.0.0.3"}


def chat(model: str, tokens: int = 3) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": tokens}


@contextmanager
def own_redis(directory: Path) -> Iterator[RedisServer]:
    """A ``redis-server`` of the test's own on a spare port, stopped at the end."""
    if not redis_server_available():
        missing("redis-server is not installed (Debian package redis-server)")
    server = RedisServer(directory).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Cluster:
    tmp_path: Path
    env: dict[str, str]
    routers: dict[str, Server]
    web: Server
    stack: ExitStack

    def node_args(self, name: str, *extra: str) -> list[str]:
        return ["runrouter", "--node", name, "--advertise", ADDRESSES[name], *extra]

    def start_node(self, name: str, *extra: str) -> Server:
        args = self.node_args(name, "--models-max", "1", *extra)
        server = self.stack.enter_context(
            run_manage(args, self.tmp_path / name, env=self.env, ready="router running")
        )
        self.routers[name] = server
        return server

    def models(self) -> dict[str, dict[str, object]]:
        listed = httpx.get(f"{self.web.url}/v1/models", timeout=30).json()["data"]
        return {m["id"]: m for m in listed}

    def node_of(self, model: str) -> object:
        return self.models()[model]["node"]

    def children(self, node: str, marker: str) -> list[list[str]]:
        return [p.cmdline() for p in simserver_processes(marker, self.routers[node].process.pid)]

    def nodes_seen(self) -> dict[str, str]:
        """Node name -> live or lost, as the web process's directory shows them."""
        status = httpx.get(f"{self.web.url}/v1/nodes", timeout=30).json()["data"]
        return {n["node"]: n["state"] for n in status}


@contextmanager
def cluster(
    tmp_path: Path, pg_database: str, redis: RedisServer, presets: str, *extra: str
) -> Iterator[Cluster]:
    ini = tmp_path / "models.ini"
    ini.write_text(presets)
    env = {"DATABASE_URL": pg_database, "REDIS_URL": redis.url}
    with ExitStack() as stack:
        found = Cluster(tmp_path, env, {}, None, stack)  # type: ignore[arg-type]
        # The first node imports the presets into the shared database; the second reads them.
        found.start_node("studio-1", "--models-preset", str(ini), *extra)
        found.start_node("studio-2", *extra)
        found.web = stack.enter_context(
            run_manage(["serve", "--no-router"], tmp_path / "web", env=env, port=free_port())
        )
        wait_until(lambda: found.nodes_seen() == dict.fromkeys(ADDRESSES, "live"), 20, "2 nodes")
        yield found
