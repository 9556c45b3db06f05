"""What a router adds to a request, hot and cold, against the least a Python proxy can add.

    .venv/bin/python bench/floor.py [--requests 400] [--out FILE]

proxy.py interleaves its targets: every request to a router follows requests to the other
routers and children, so each router answers it after a pause in which other processes ran on
its core (a cold path: caches and branch history gone). A router whose code and data for one
request are large pays for that on every request; a small one hardly. This part measures the
same routers both ways, on one real llama-server child each (the tiny GGUF), ``/tokenize``,
with the client keeping its connection and with a new connection per request:

* cold: as proxy.py, the targets interleaved request by request, in a shuffled order;
* hot: blocks of 25 requests to one target in a row (the first of each block dropped), the
  blocks of a router and of its own direct child alternating.

Added = the router's median minus its direct child's median, in the same mode.

Targets: llama.cpp's router; RouterPanel's ``serve`` on Daphne and on uvicorn; and the floor,
``python bench/floor.py --relay PORT CHILD_PORT``: a relay on uvloop with the ``httptools``
parser that passes each request's bytes to one kept-alive connection to the child and the
answer's bytes back, with nothing else (no routing, keys, engine, error shapes, timeouts or
retry). It is not a router; it shows how much of RouterPanel's added time is Python and the
event loop themselves, and how much is its own work per request.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, proxy
from bench.common import Client, Processes, Table
from bench.proxy import Target

MODEL = "tiny"
BLOCK = 25  # requests to one target in a row, hot mode (the first is dropped)


# ---- the floor: a bare relay --------------------------------------------------------------


def relay(port: int, child_port: int) -> None:
    """Serve the bare relay on 127.0.0.1:``port`` in front of the child; never returns."""
    import httptools
    import uvloop

    idle: list[Upstream] = []
    connecting: set[asyncio.Task[None]] = set()

    class Parsed(asyncio.Protocol):
        """A connection whose bytes are kept (``pieces``) and fed to ``parser``."""

        parser: httptools.HttpRequestParser | httptools.HttpResponseParser

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]
            self.pieces: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.pieces.append(data)
            self.parser.feed_data(data)

    class Upstream(Parsed):
        def __init__(self) -> None:
            self.parser = httptools.HttpResponseParser(self)
            self.client: Downstream | None = None

        def on_message_complete(self) -> None:
            answer, self.pieces = b"".join(self.pieces), []
            client, self.client = self.client, None
            if self.parser.should_keep_alive():
                idle.append(self)
            else:  # the child closes it (llama-server: after 100 requests on one connection)
                self.transport.close()
            if client is not None:
                client.answer(answer)

        def connection_lost(self, exc: Exception | None) -> None:
            if self in idle:
                idle.remove(self)

    class Downstream(Parsed):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.keep = True

        def on_message_complete(self) -> None:
            request, self.pieces = b"".join(self.pieces), []
            self.keep = self.parser.should_keep_alive()
            if idle:
                self.forward(idle.pop(), request)
            else:
                task = asyncio.ensure_future(self.connect(request))
                connecting.add(task)
                task.add_done_callback(connecting.discard)

        async def connect(self, request: bytes) -> None:
            loop = asyncio.get_running_loop()
            _, upstream = await loop.create_connection(Upstream, common.HOST, child_port)
            self.forward(upstream, request)

        def forward(self, upstream: Upstream, request: bytes) -> None:
            upstream.client = self
            upstream.transport.write(request)

        def answer(self, data: bytes) -> None:
            self.transport.write(data)
            if not self.keep:
                self.transport.close()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Downstream, common.HOST, port)
        await server.serve_forever()

    uvloop.run(main())


# ---- measuring ------------------------------------------------------------------------------


def hot(
    targets: list[Target], reuse: bool, requests: int, rng: random.Random
) -> dict[str, list[float]]:
    """Blocks of ``BLOCK`` requests per target, the targets' blocks in a shuffled order each
    round, until every target has ``requests`` samples."""
    clients = {t.label: Client(t.port, reuse=reuse) for t in targets}
    bodies = {t.label: proxy.payload("/tokenize", t.model) for t in targets}
    samples: dict[str, list[float]] = {t.label: [] for t in targets}
    try:
        while min(len(s) for s in samples.values()) < requests:
            order = list(targets)
            rng.shuffle(order)
            for t in order:
                for i in range(BLOCK):
                    elapsed, status, body = clients[t.label].post("/tokenize", bodies[t.label])
                    if status != 200:
                        raise RuntimeError(f"{t.label} answered {status}: {body[:300]!r}")
                    if i:
                        samples[t.label].append(elapsed)
    finally:
        for client in clients.values():
            client.close()
    return samples


def added(targets: list[Target], samples: dict[str, list[float]]) -> dict[str, float]:
    med = {label: common.median(s) for label, s in samples.items()}
    return {t.label: med[t.label] - med[t.baseline] for t in targets if t.baseline}


def run(requests: int, seed: int = 11434) -> Table:
    rng = random.Random(seed)
    table = Table(
        f"Added ms per /tokenize, hot and cold ({requests} requests per target and row)",
        ["connection", "mode", "llama.cpp router", "RouterPanel (Daphne)",
         "RouterPanel --http uvicorn", "floor: bare relay"],
    )  # fmt: skip
    with common.workdir("floor") as work, Processes(work) as procs:
        _, _, (rp, uv, llama) = proxy.three_routers(procs, work)
        floor_child = common.child_port(uv, MODEL)
        port = common.free_port()
        argv = [common.PYTHON, __file__, "--relay", str(port), str(floor_child)]
        floor = procs.start("floor", argv, port=port)
        common.wait_until(
            lambda: Client(port, reuse=False).post("/tokenize", proxy.payload("/tokenize", MODEL))
            [1] == 200, 30, "the bare relay", floor,
        )  # fmt: skip
        routers = [
            ("llama.cpp router", llama.port, common.child_port(llama, MODEL)),
            ("RouterPanel (Daphne)", rp.port, common.child_port(rp, MODEL)),
            ("RouterPanel --http uvicorn", uv.port, floor_child),
            ("floor: bare relay", port, floor_child),
        ]
        targets: list[Target] = []
        directs: dict[int, str] = {}  # child port -> its direct target's label
        for label, router_port, child in routers:
            if child not in directs:
                directs[child] = f"direct ({label})"
                targets.append(Target(directs[child], child, MODEL))
            targets.append(Target(label, router_port or 0, MODEL, directs[child]))
        for reuse in (True, False):
            for mode in ("hot", "cold"):
                if mode == "hot":
                    samples = hot(targets, reuse, requests, rng)
                else:
                    samples = proxy.interleave(targets, "/tokenize", reuse, requests, rng)
                got = added(targets, samples)
                llama_ms = got["llama.cpp router"]
                cells = [
                    f"{common.signed_ms(got[label])} ({got[label] / llama_ms:.2f})"
                    for label, _, _ in routers
                ]
                table.add("reuse" if reuse else "new", mode, *cells)
    table.notes.append(
        "Each cell: the router's median minus its own direct child's median in the same mode, "
        "and in brackets that figure ÷ llama.cpp's router's in the same row. RouterPanel on "
        "uvicorn and the bare relay share one child (so their direct rows are one target)."
    )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per target (400)")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    parser.add_argument("--relay", nargs=2, type=int, metavar=("PORT", "CHILD_PORT"),
                        help="serve the bare relay instead of measuring")  # fmt: skip
    args = parser.parse_args(argv)
    if args.relay:
        relay(*args.relay)
        return
    common.report([run(args.requests)], args.out)


if __name__ == "__main__":
    main()
