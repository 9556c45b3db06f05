"""The proxy's upstream client: what each candidate costs per request to a real llama-server.

    .venv/bin/python bench/upstream_clients.py [--requests 300] [--rounds 5]

One real llama-server child (the tiny GGUF), one process measuring, sequential requests on one
kept-alive connection, in rounds that interleave the candidates (so a busy machine's drift hits
them alike); the figure is the median over rounds of each round's median per-request time.
Candidates:

* ``ours``: what the proxy runs today (``models_app.api.upstream.ChildPool`` on
  ``models_app.api.relay``: an asyncio protocol with the ``httptools`` parser, retry-once,
  timeouts, back-pressure);
* ``httpx``: httpx's transport, no client around it (the proxy's client until 2026-11);
* ``httpcore``: httpcore's connection pool used directly;
* ``aiohttp``: aiohttp's client session (``pip install aiohttp==3.14.5``; skipped, with the
  reason printed, when it is not installed);
* ``relay``: a minimal keep-alive relay on an asyncio protocol with the ``httptools`` parser
  (``pip install httptools==0.9.0``): one write per request, nothing else — the floor any client
  in Python on asyncio could reach, not a complete client (no retry, 1xx or timeouts).

Requests: ``/tokenize`` (a 17-token answer) and a 32-token chat completion without streaming,
each read whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common

One = Callable[[], Awaitable[bytes]]
Close = Callable[[], Awaitable[None]]
Maker = Callable[[int, str, bytes], Awaitable[tuple[One, Close]]]

ROUTES = {
    "/tokenize": {"content": "hello world " * 8},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 32,
        "ignore_eos": True,
    },
}


async def make_ours(port: int, path: str, body: bytes) -> tuple[One, Close]:
    from models_app.api.config import ApiConfig
    from models_app.api.upstream import ChildPool
    from routerpanel.router.address import LOOPBACK, ChildAddress

    pool = ChildPool(ChildAddress(LOOPBACK, port), ApiConfig())
    headers = [(b"content-type", b"application/json")]

    async def one() -> bytes:
        response = await pool.send("POST", path, headers, body)
        try:
            return await response.read()
        finally:
            await response.aclose()

    return one, pool.aclose


async def make_httpx(port: int, path: str, body: bytes) -> tuple[One, Close]:
    import httpx

    transport = httpx.AsyncHTTPTransport()
    url = f"http://127.0.0.1:{port}{path}"
    headers = {"content-type": "application/json"}

    async def one() -> bytes:
        request = httpx.Request("POST", url, headers=headers, content=body)
        response = await transport.handle_async_request(request)
        try:
            return await response.aread()
        finally:
            await response.aclose()

    return one, transport.aclose


async def make_httpcore(port: int, path: str, body: bytes) -> tuple[One, Close]:
    import httpcore

    pool = httpcore.AsyncConnectionPool()
    url = f"http://127.0.0.1:{port}{path}"
    headers = [
        (b"host", f"127.0.0.1:{port}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]

    async def one() -> bytes:
        async with pool.stream("POST", url, headers=headers, content=body) as response:
            return b"".join([chunk async for chunk in response.aiter_stream()])

    return one, pool.aclose


async def make_aiohttp(port: int, path: str, body: bytes) -> tuple[One, Close]:
    import aiohttp

    session = aiohttp.ClientSession(
        auto_decompress=False, skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding")
    )
    url = f"http://127.0.0.1:{port}{path}"
    headers = {"content-type": "application/json"}

    async def one() -> bytes:
        async with session.post(url, data=body, headers=headers) as response:
            return await response.read()

    return one, session.close


async def make_relay(port: int, path: str, body: bytes) -> tuple[One, Close]:
    import httptools

    loop = asyncio.get_running_loop()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()

    class Connection(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport: asyncio.Transport | None = None
            self.keep = True
            self.chunks: list[bytes] = []
            self.done: asyncio.Future[bytes] = loop.create_future()
            self.parser = httptools.HttpResponseParser(self)

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.keep = False

        def on_body(self, chunk: bytes) -> None:
            self.chunks.append(chunk)

        def on_message_complete(self) -> None:
            self.keep = self.keep and self.parser.should_keep_alive()
            self.done.set_result(b"".join(self.chunks))

    connection: Connection | None = None

    async def one() -> bytes:
        nonlocal connection
        if connection is None or not connection.keep:  # llama-server closes after 100 requests
            if connection is not None and connection.transport is not None:
                connection.transport.close()
            _, connection = await loop.create_connection(Connection, common.HOST, port)
        connection.chunks, connection.done = [], loop.create_future()
        connection.parser = httptools.HttpResponseParser(connection)
        assert connection.transport is not None
        connection.transport.write(head + body)
        return await connection.done

    async def close() -> None:
        if connection is not None and connection.transport is not None:
            connection.transport.close()

    return one, close


CANDIDATES: dict[str, tuple[Maker, str | None]] = {
    "ours": (make_ours, None),
    "httpx": (make_httpx, None),
    "httpcore": (make_httpcore, None),
    "aiohttp": (make_aiohttp, "aiohttp"),
    "relay": (make_relay, "httptools"),
}


def available() -> dict[str, Maker]:
    out = {}
    for name, (maker, module) in CANDIDATES.items():
        if module is not None:
            try:
                __import__(module)
            except ImportError:
                print(f"{name}: skipped, {module} is not installed (see the module doc)")
                continue
        out[name] = maker
    return out


async def one_round(maker: Maker, port: int, path: str, body: bytes, requests: int) -> float:
    one, close = await maker(port, path, body)
    try:
        expected = await one()
        assert expected, f"empty answer from {path}"
        for _ in range(20):  # warm up the connection and the child
            await one()
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            await one()
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        await close()


async def measure(port: int, requests: int, rounds: int) -> dict[str, dict[str, float]]:
    makers = available()
    results: dict[str, dict[str, list[float]]] = {path: {n: [] for n in makers} for path in ROUTES}
    for round_no in range(rounds):
        order = list(makers) if round_no % 2 == 0 else list(reversed(makers))
        for path, payload in ROUTES.items():
            body = json.dumps(payload).encode()
            for name in order:
                results[path][name].append(
                    await one_round(makers[name], port, path, body, requests)
                )
    return {
        path: {name: statistics.median(values) for name, values in by_name.items()}
        for path, by_name in results.items()
    }


def table(figures: dict[str, dict[str, float]]) -> str:
    names = list(next(iter(figures.values())))
    lines = [
        "| route | " + " | ".join(f"{n} (µs)" for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for path, by_name in figures.items():
        cells = []
        base = by_name["ours"]
        for name in names:
            value = by_name[name]
            cells.append(
                f"{value * 1e6:.0f}" + ("" if name == "ours" else f" ({value / base:.2f}×)")
            )
        lines.append(f"| `{path}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(requests: int = 300, rounds: int = 5) -> str:
    server_bin = common.llama_server_bin()
    model = common.tiny_models()["tiny"]
    with common.workdir("upstream-clients") as work, common.Processes(work) as procs:
        port = common.free_port()
        child = procs.start(
            "llama-server",
            [str(server_bin), "-m", str(model), "--port", str(port), "-np", "4", "-c", "2048"],
            port=port,
        )
        common.wait_until(
            lambda: common.get_json(child.url, "/health", timeout=2).get("status") == "ok",
            120,
            "llama-server healthy",
            child,
        )
        figures = asyncio.run(measure(port, requests, rounds))
    return (
        f"Per request, one kept-alive connection, {requests} sequential requests × {rounds} "
        f"rounds (median of round medians; ratio to ours):\n\n" + table(figures)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args: Any = parser.parse_args(argv)
    print(run(args.requests, args.rounds))


if __name__ == "__main__":
    main()
