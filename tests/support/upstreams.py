"""Real upstreams for the HTTP surface's tests: the simulated llama-server and a scripted one.

``SimServer`` runs the simulated llama-server (``routerpanel.router.simserver``) as a real
subprocess; ``ScriptedUpstream`` is a tiny HTTP/1.1 server that records what it receives and can
drop a connection without answering (for the retry rule). ``save_two_sim_presets`` stores two
presets of simulated children, as the router host tests' database.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.asgi import DEADLINE
from tests.support.paths import REPO


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


def save_two_sim_presets(load_ms: int = 50) -> None:
    """Store presets m1 and m2 (simulated children loading in ``load_ms``) and models_max 1:
    the router host tests' database, where every request for the other model is a swap."""
    from models_app.models import Preset, RouterSettings
    from models_app.presets.sources import simserver_command

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
