"""Fixtures for the HTTP surface: the ASGI app on a fake router, a driver, and real upstreams.

``AsgiClient`` calls the ASGI app directly with its own ``receive``/``send``, like Daphne does:
the body arrives as ``http.request`` messages, response messages are recorded with the time
they were sent, ``disconnect()`` delivers ``http.disconnect`` at any moment, and after the last
body message ``http.disconnect`` follows (Daphne sends one when it finishes a response).

Upstreams: the simulated llama-server (``routerpanel.router.simserver``) as a real subprocess,
and ``ScriptedUpstream``, a tiny HTTP/1.1 server that records what it receives and can drop a
connection without answering (for the retry rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore, KeyTable
from models_app.bridge import RouterClient
from tests.serving import llama_server_stand_in
from tests.support.fake_router import FakeRouter

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 30.0  # generous: the machine is small and busy
ROUTER_TIMEOUT = 1.0  # the bridge's "router unavailable" timeout, small for tests


# ---- the llama-server the presets are checked against ---------------------------------------


@pytest.fixture(autouse=True, scope="session")
def llama_server_b11434(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Put a ``llama-server`` on PATH that prints b11434's ``--help`` (recorded from the real
    build), so that preset keys are checked against b11434 whatever this machine has installed
    (a newer llama-server on PATH would otherwise change what the app tier accepts)."""
    bin_dir = tmp_path_factory.mktemp("llama-bin")
    script = llama_server_stand_in(bin_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        yield script


# ---- the ASGI driver ------------------------------------------------------------------------


class Call:
    """One request in flight through an ASGI app."""

    def __init__(
        self,
        app: Any,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        body_parts: list[bytes] | None = None,
        headers: dict[str, str] | None = None,
        query: str = "",
        extensions: dict[str, Any] | None = None,
    ) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[tuple[float, bytes]] = []
        self.started = asyncio.Event()
        self.ended = asyncio.Event()
        self._changed = asyncio.Condition()
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        parts = body_parts if body_parts is not None else [body]
        for n, part in enumerate(parts):
            more = n < len(parts) - 1
            self._inbox.put_nowait({"type": "http.request", "body": part, "more_body": more})
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
        }
        if extensions is not None:  # what a server offers beyond ASGI (request.CHUNK_NOW)
            scope["extensions"] = extensions
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        return await self._inbox.get()

    async def _send(self, message: dict[str, Any]) -> None:
        assert not self.ended.is_set(), f"message after the response ended: {message}"
        if message["type"] == "http.response.start":
            assert not self.started.is_set()
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            self.started.set()
        else:
            assert message["type"] == "http.response.body", message
            assert self.started.is_set()
            async with self._changed:
                self.chunks.append((time.monotonic(), message.get("body", b"")))
                self._changed.notify_all()
            if not message.get("more_body", False):
                self.ended.set()
                self._inbox.put_nowait({"type": "http.disconnect"})

    def disconnect(self) -> None:
        self._inbox.put_nowait({"type": "http.disconnect"})

    async def finish(self, timeout: float = DEADLINE) -> Call:
        async with asyncio.timeout(timeout):
            await self.task
        return self

    async def wait_started(self, timeout: float = DEADLINE) -> None:
        async with asyncio.timeout(timeout):
            await self.started.wait()

    async def wait_body(
        self, predicate: Callable[[bytes], bool], timeout: float = DEADLINE
    ) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self.body))

    @property
    def body(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        values = [v.decode() for k, v in self.headers if k.lower() == wanted]
        assert len(values) <= 1, f"{name} appears {len(values)} times"
        return values[0] if values else None


class AsgiClient:
    def __init__(self, app: Any) -> None:
        self.app = app

    def start(self, method: str, path: str, *, json_body: Any = None, **kwargs: Any) -> Call:
        if json_body is not None:
            kwargs["body"] = json.dumps(json_body).encode()
            kwargs.setdefault("headers", {}).setdefault("content-type", "application/json")
        if "?" in path:
            path, kwargs["query"] = path.split("?", 1)
        return Call(self.app, method, path, **kwargs)

    async def request(self, method: str, path: str, **kwargs: Any) -> Call:
        return await self.start(method, path, **kwargs).finish()

    async def get(self, path: str, **kwargs: Any) -> Call:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, json_body: Any = None, **kwargs: Any) -> Call:
        return await self.request("POST", path, json_body=json_body, **kwargs)


async def django_stand_in(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Plays Django for the fall-through: /panel/ is a page, anything else its HTML 404."""
    status = 200 if scope["path"] == "/panel/" else 404
    headers = [(b"content-type", b"text/html; charset=utf-8")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"<html>django</html>"})


# ---- fixtures: router, keys, app --------------------------------------------------------------


@pytest.fixture
def layer() -> InMemoryChannelLayer:
    return InMemoryChannelLayer()


@pytest.fixture
async def router(layer: InMemoryChannelLayer) -> AsyncIterator[FakeRouter]:
    fake = await FakeRouter(layer).start()
    yield fake
    await fake.stop()


@pytest.fixture
def key_table() -> dict[str, Any]:
    """Edit to change what the 'database' says: {"required": bool, "keys": {hash: Caller},
    "names": {name or alias: (name, *aliases)}, "operators": {actor}}."""
    return {"required": False, "keys": {}, "names": {}, "operators": set()}


@pytest.fixture
def keys(key_table: dict[str, Any]) -> KeyStore:
    def load() -> KeyTable:
        return KeyTable(
            key_table["required"],
            dict(key_table["keys"]),
            frozenset(key_table["operators"]),
            dict(key_table["names"]),
        )

    return KeyStore(load, None)


@pytest.fixture
def config() -> ApiConfig:
    return ApiConfig(sse_keepalive=0.3)


@pytest.fixture
async def api(
    router: FakeRouter, layer: InMemoryChannelLayer, keys: KeyStore, config: ApiConfig
) -> AsyncIterator[Api]:
    app = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=ROUTER_TIMEOUT),
        keys=keys,
        config=config,
    )
    yield app
    await app.aclose()


@pytest.fixture
def client(api: Api) -> AsgiClient:
    return AsgiClient(api)


# ---- upstreams ------------------------------------------------------------------------------


class SimServer:
    """The simulated llama-server as a subprocess in its own session (killed with its group)."""

    def __init__(self, log_path: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_SERVER_ROUTER_PORT",)}
        env.pop("LLAMA_API_KEY", None)
        with log_path.open("wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "routerpanel.router.simserver", "--port", "0", *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
            )
        self.log_path = log_path
        self.port = self._wait_for_port()

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            found = re.search(r"listening on http://[^:]+:(\d+)", self.log_path.read_text())
            if found:
                return int(found.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"simserver exited: {self.log_path.read_text()}")
            time.sleep(0.02)
        raise RuntimeError("simserver did not start listening")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture(scope="session")
def simserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """A fast simulated child: no token delay, metrics and embeddings on."""
    sim = SimServer(
        tmp_path_factory.mktemp("sim") / "fast.log", "-m", "fast.gguf", "--metrics", "--embeddings"
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="session")
def slow_simserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """A slow simulated child: 100 ms per token, up to 100 tokens (ask for fewer: n_predict)."""
    log_path = tmp_path_factory.mktemp("sim") / "slow.log"
    args = ("-m", "slow.gguf", "--sim-token-ms", "100", "--sim-tokens", "100", "--metrics")
    sim = SimServer(log_path, *args)
    yield sim
    sim.stop()


def save_two_sim_presets(load_ms: int = 50) -> None:
    """Store presets m1 and m2 (simulated children loading in ``load_ms``) and models_max 1:
    the router host tests' database, where every request for the other model is a swap."""
    from models_app.models import Preset, RouterSettings
    from models_app.sources import simserver_command

    for name in ("m1", "m2"):
        args = [["sim-load-ms", str(load_ms)]]
        preset = Preset(name=name, server_bin=simserver_command(), args=args)
        preset.full_clean()
        preset.save()
    row = RouterSettings.load()
    row.models_max = 1
    row.save()


@dataclass
class Received:
    connection: int
    index: int  # 1-based position on its connection
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ScriptedUpstream:
    """A minimal keep-alive HTTP/1.1 server that records requests and answers from a script.

    ``answer(received) -> (status, headers, body)``, or raw bytes to write before closing the
    connection; ``drop(received) -> bool`` closes the connection after reading that request,
    without a byte of answer.
    """

    answer: Callable[[Received], tuple[int, list[tuple[str, str]], bytes] | bytes] = lambda r: (
        200,
        [("Content-Type", "application/json")],
        b'{"ok":true}',
    )
    drop: Callable[[Received], bool] = lambda r: False
    received: list[Received] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _connections: Any = field(default_factory=lambda: itertools.count(1))

    async def start(self) -> ScriptedUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = next(self._connections)
        try:
            for index in itertools.count(1):
                received = await self._read(reader, connection, index)
                if received is None:
                    return
                self.received.append(received)
                if self.drop(received):
                    return
                answer = self.answer(received)
                if isinstance(answer, bytes):
                    writer.write(answer)
                    await writer.drain()
                    return
                status, headers, body = answer
                head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}"]
                head += [f"{name}: {value}" for name, value in headers]
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _read(
        self, reader: asyncio.StreamReader, connection: int, index: int
    ) -> Received | None:
        line = await reader.readline()
        if not line:
            return None
        method, target, _ = line.decode().split(" ", 2)
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, value = line.decode().split(":", 1)
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return Received(connection, index, method, target, headers, body)


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    server = await ScriptedUpstream().start()
    yield server
    await server.stop()
