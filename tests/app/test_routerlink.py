"""Team mode's router connection (routing/link*.py): framing, multiplexing, order, loss.

A real ``RouterHost`` with simulated children listens on a Unix socket in the test's directory;
the tests speak to it as a web process does, raw (to see the order of what arrives) or through
the ``Linked`` transport over a ``Connection``.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer

from models_app.routing import link as framing
from models_app.routing import link_client, wire
from models_app.routing.host import RouterHost
from models_app.routing.layer import FIRST_ANSWER_CAP, Layer
from models_app.routing.link import Address
from models_app.routing.link_client import Connection
from models_app.routing.link_server import LinkServer
from models_app.routing.linked import Linked
from models_app.routing.transport import Ask
from routerpanel.router.catalogue import Event
from routerpanel.router.errors import Lease, RouterError
from routerpanel.router.receipts import Receipt
from tests.support.upstreams import save_two_sim_presets

pytestmark = pytest.mark.django_db(transaction=True)
DEADLINE = 30.0


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[RouterHost]:
    await sync_to_async(save_two_sim_presets)()
    host = RouterHost(InMemoryChannelLayer(), state_file=tmp_path / "children.json")
    host.link = LinkServer(host.desk, Address("unix", str(framing.socket_path(tmp_path))))
    await host.start()
    assert host.link.listening
    yield host
    await asyncio.wait_for(host.stop(), DEADLINE)


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message on a raw connection (bad lines skipped); None when it closed."""
    while True:
        line = await reader.readline()
        if not line.endswith(b"\n"):
            return None
        if (message := framing.decode(line)) is not None:
            return message


class Raw:
    """A web process's side of the socket, spoken by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: RouterHost) -> tuple[Raw, dict[str, Any]]:
        path = host.link.address.path
        reader, writer = await asyncio.open_unix_connection(path)
        raw = cls(reader, writer)
        return raw, await raw.next()

    def send(self, *messages: dict[str, Any]) -> None:
        self.writer.write(b"".join(framing.encode(m) for m in messages))  # one write

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(DEADLINE):
            message = await read_message(self.reader)
        assert message is not None, "the router closed the connection"
        return message

    async def until(self, request_id: str, *types: str) -> dict[str, Any]:
        while True:
            message = await self.next()
            if message.get("request_id") == request_id and message["type"] in types:
                return message

    def close(self) -> None:
        self.writer.close()


def acquire(request_id: str, model: str, **extra: Any) -> dict[str, Any]:
    now = time.time()
    return {"type": "router.acquire", "request_id": request_id, "model": model, "actor": "t",
            "autoload": True, "sent": now, "expires": now + 30, "boot": None, **extra}  # fmt: skip


def in_flight(host: RouterHost) -> dict[str, int]:
    assert host.engine is not None
    return {m["name"]: m["in_flight"] for m in host.engine.snapshot()["models"] if m["in_flight"]}


async def until(check: Any, what: str, deadline: float = DEADLINE) -> None:
    async with asyncio.timeout(deadline):
        while not check():
            await asyncio.sleep(0.01)


# ---- framing ------------------------------------------------------------------------------


def test_addresses_parse_for_unix_and_tcp() -> None:
    assert Address.parse("unix:/run/rp/router.sock") == Address("unix", path="/run/rp/router.sock")
    assert Address.parse("tcp:10.0.0.2:7070") == Address("tcp", host="10.0.0.2", port=7070)
    assert Address.parse("tcp:[::1]:7070") == Address("tcp", host="::1", port=7070)
    assert str(Address.parse("tcp:node-b:7070")) == "tcp:node-b:7070"
    for bad in ("", "unix:", "tcp:host", "tcp:host:x", "http://x"):
        assert Address.parse(bad) is None, bad


def test_a_socket_path_too_long_for_the_kernel_moves_to_the_temp_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    path = framing.socket_path(deep)
    assert len(os.fsencode(path)) <= framing.UNIX_PATH_MAX
    assert path == framing.socket_path(deep)  # one per data dir
    assert path != framing.socket_path(tmp_path / ("e" * 120))


def test_lines_frame_messages_and_bad_ones_are_skipped_or_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(framing, "LINE_LIMIT", 64)
    lines = framing.Lines()
    assert lines.feed(b'{"type":"a","n":1}\nnot json\n[1]\n{"type":"b"}\n{"type":"c"') == [
        {"type": "a", "n": 1},
        {"type": "b"},  # two bad lines skipped
    ]
    assert lines.feed(b',"n":') == []  # the rest of a line waits for its end
    assert lines.feed(b'2}\n{"type":"d"}\n') == [{"type": "c", "n": 2}, {"type": "d"}]
    assert lines.feed(b"") == []
    with pytest.raises(ValueError):  # a whole line over the limit
        framing.Lines().feed(b'{"type":"x","pad":"' + b"y" * 100 + b'"}\n')
    unended = framing.Lines()
    assert unended.feed(b'{"type":"x","pad":"' + b"y" * 40) == []
    with pytest.raises(ValueError):  # a line that has not ended but is over the limit already
        unended.feed(b"y" * 40)
    assert framing.decode(framing.encode({"type": "t", "é": "ü"})) == {"type": "t", "é": "ü"}


def test_every_answer_and_an_acquire_cross_the_link_unchanged() -> None:
    """The codec (orjson) gives back what the wire's builders made, type for type: floats
    stay floats, a tuple of evicted models arrives as a list (as JSON has it), None stays."""
    receipt = Receipt(queued=0.25, load=1.5, evicted=("m2", "m3"), caused_load=True)
    shutting = RouterError(503, "unavailable_error", "router is shutting down", 5.0)
    refused = RouterError(400, "unavailable_error", "router is shutting down")
    sent = time.time()
    messages: list[dict[str, Any]] = [
        dict(
            wire.granted(
                "r1", Lease("abc-1", "r1", "m1", 41234, 0.0, receipt=receipt, key="k"), 30.0, "b1"
            )
        ),
        dict(wire.granted("r2", Lease("abc-2", "r2", "m1", 41234, 0.0), 30.0, "b1")),
        dict(wire.queued("r3", 2, "b1")),
        dict(wire.rejected("r4", shutting, "b1")),
        dict(wire.rejected("r5", refused)),
        acquire("r6", "m1") | {"sent": sent, "expires": sent + 30.0, "boot": "b1"},
        {"type": "router.renew", "lease_id": "abc-1", "idle": 0.5},
        {"type": "router.release", "lease_id": "abc-1"},
    ]
    for message in messages:
        line = framing.encode(message)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        back = framing.decode(line[:-1])
        expected = {k: list(v) if isinstance(v, tuple) else v for k, v in message.items()}
        assert back == expected
        assert [type(v) for v in back.values()] == [type(v) for v in expected.values()]
    assert framing.decode(b'{"type":"x","s":"\xff"}') is None  # not UTF-8: not a message
    assert framing.decode(b'{"type":"x","n":NaN}') is None  # not JSON
    with pytest.raises(TypeError):
        framing.encode({"type": "x", "when": object()})


async def test_a_line_over_the_limit_closes_the_connection_and_loses_its_peer(
    host: RouterHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, _ = await Raw.open(host)
    raw.send(acquire("kept", "m1"))
    await raw.until("kept", "router.granted")
    assert in_flight(host) == {"m1": 1}
    monkeypatch.setattr(framing, "LINE_LIMIT", 64)
    raw.writer.write(b'{"type":"router.release","pad":"' + b"y" * 100)  # no end in sight
    async with asyncio.timeout(DEADLINE):
        assert await read_message(raw.reader) is None  # the router closed the connection
    await until(lambda: in_flight(host) == {}, "its lease ended with the connection")
    assert not host.link.peers and not host.link.connections


# ---- the router's listener ----------------------------------------------------------------


async def test_the_socket_is_private_replaces_a_stale_one_and_goes_at_stop(tmp_path: Path) -> None:
    await sync_to_async(save_two_sim_presets)()
    path = tmp_path / "r.sock"
    import socket as socketlib

    stale = socketlib.socket(socketlib.AF_UNIX)
    stale.bind(str(path))  # what a killed router leaves: a socket file nobody listens on
    stale.close()
    host = RouterHost(InMemoryChannelLayer(), state_file=tmp_path / "children.json")
    host.link = LinkServer(host.desk, Address("unix", str(path)))
    await host.start()
    try:
        assert host.link.listening
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        raw, hello = await Raw.open(host)
        assert hello == {"type": "link.hello", "boot": host.boot, "protocol": 1}
        raw.close()
    finally:
        await asyncio.wait_for(host.stop(), DEADLINE)
    assert not path.exists()


async def test_a_file_that_is_not_a_socket_is_never_removed(tmp_path: Path) -> None:
    await sync_to_async(save_two_sim_presets)()
    path = tmp_path / "r.sock"
    path.write_text("precious")
    host = RouterHost(InMemoryChannelLayer(), state_file=tmp_path / "children.json")
    host.link = LinkServer(host.desk, Address("unix", str(path)))
    await host.start()
    try:
        assert not host.link.listening  # channels only
        assert path.read_text() == "precious"
    finally:
        await asyncio.wait_for(host.stop(), DEADLINE)


async def test_requests_on_one_connection_are_answered_by_request_id(host: RouterHost) -> None:
    raw, _ = await Raw.open(host)
    raw.send(acquire("r1", "m1"), acquire("r2", "m1"), acquire("r3", "nope"))
    rejected = await raw.until("r3", "router.rejected")
    assert rejected["status"] == 404 or rejected["status"] == 400, rejected
    granted = [await raw.until(r, "router.granted") for r in ("r1", "r2")]
    assert {g["lease_id"] for g in granted} and granted[0]["lease_id"] != granted[1]["lease_id"]
    assert granted[0]["boot"] == host.boot and granted[0]["caused_load"] is True  # the receipt
    assert in_flight(host) == {"m1": 2}
    raw.send(*({"type": "router.release", "lease_id": g["lease_id"]} for g in granted))
    await until(lambda: in_flight(host) == {}, "both released")
    assert host.acquires["socket"] == 3 and host.acquires["channel"] == 0
    raw.close()


async def test_an_acquire_and_its_cancel_arrive_in_order(host: RouterHost) -> None:
    raw, _ = await Raw.open(host)
    for i in range(20):  # each cancel right behind its acquire, in the same write
        raw.send(acquire(f"gone{i}", "m1"), {"type": "router.cancel", "request_id": f"gone{i}"})
    raw.send(acquire("kept", "m1"))
    kept = await raw.until("kept", "router.granted")
    await asyncio.sleep(0.2)  # anything a reordered acquire would still get
    assert host.engine is not None
    assert in_flight(host) == {"m1": 1}  # only "kept": no cancelled one holds a lease
    assert all(host.engine.lease_for(f"gone{i}") is None for i in range(20))
    assert host.engine.snapshot()["queue"] == []
    raw.send({"type": "router.release", "lease_id": kept["lease_id"]})
    raw.close()


async def test_a_closed_connection_ends_its_leases_and_queued_requests_at_once(
    host: RouterHost,
) -> None:
    assert host.engine is not None
    events = host.engine.subscribe()
    holder, _ = await Raw.open(host)
    holder.send(acquire("held", "m1"))
    await holder.until("held", "router.granted")
    waiter, _ = await Raw.open(host)
    waiter.send(acquire("queued", "m2"))  # models_max 1 and m1 busy: it waits
    await waiter.until("queued", "router.queued")
    waiter.close()
    await until(lambda: host.engine is not None and not host.engine.snapshot()["queue"], "queue")
    assert in_flight(host) == {"m1": 1}
    holder.close()  # the lease TTL is 30 s+: only the closed connection can end it this soon
    await until(lambda: in_flight(host) == {}, "the lease ended")
    async with asyncio.timeout(DEADLINE):
        async for event in events:
            if event.type == Event.LEASE_EXPIRED:  # and the engine says so: not its TTL
                assert event.data["why"] == "disconnected" and event.data["request_id"] == "held"
                break


async def test_an_acquire_granted_at_once_is_answered_without_a_task(
    host: RouterHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, _ = await Raw.open(host)
    raw.send(acquire("first", "m1"))  # m1 loads: that grant waits, in a task
    first = await raw.until("first", "router.granted")
    spawned: list[str] = []
    spawn = host.spawn

    def spy(coro: Any) -> Any:
        spawned.append(coro.__qualname__)
        return spawn(coro)

    monkeypatch.setattr(host, "spawn", spy)
    raw.send(acquire("hot", "m1"), acquire("nope", "no-such-model"))
    hot = await raw.until("hot", "router.granted")
    assert hot["caused_load"] is False and hot["lease_id"] != first["lease_id"]
    assert (await raw.until("nope", "router.rejected"))["status"] in (400, 404)
    assert [name for name in spawned if "acquire" in name] == []  # both decided on arrival
    raw.send(acquire("cold", "m2"))  # models_max 1 and m1 busy: it waits, in a task
    await raw.until("cold", "router.queued")
    assert [name for name in spawned if "acquire" in name] == ["_Peer._acquire"]
    assert in_flight(host) == {"m1": 2}
    raw.send(*({"type": "router.release", "lease_id": g["lease_id"]} for g in (first, hot)))
    await raw.until("cold", "router.granted")  # m1 idle: evicted for m2, the waiter served
    raw.close()
    await until(lambda: in_flight(host) == {}, "the connection's lease ended")


async def test_an_expired_acquire_is_dropped_never_run(host: RouterHost) -> None:
    raw, _ = await Raw.open(host)
    raw.send(acquire("late", "m1", expires=time.time() - 1), acquire("fresh", "m2"))
    await raw.until("fresh", "router.granted")
    assert host.engine is not None and host.engine.lease_for("late") is None
    assert host.acquires["socket"] == 1
    raw.close()


# ---- the web side ---------------------------------------------------------------------------


class Watch:
    """A heartbeat watch that always sees the router alive."""

    def __init__(self) -> None:
        self.beat = None
        self.changed = asyncio.Event()

    async def gone(self, boot: str | None) -> str:
        await asyncio.Event().wait()
        return ""


async def connect(host: RouterHost) -> Connection:
    link = link_client.Link(host.link.address)
    conn = await link.connect(Watch())  # type: ignore[arg-type]
    assert conn is not None and conn.boot == host.boot
    return conn


async def test_a_client_acquires_and_releases_over_the_connection(host: RouterHost) -> None:
    conn = await connect(host)
    client = Linked(Layer(InMemoryChannelLayer()))
    grants = await asyncio.gather(*(client.over(conn, Ask("m1", f"c{i}", "t")) for i in range(10)))
    assert in_flight(host) == {"m1": 10} and all(g.owner.conn is conn for g in grants)  # type: ignore[union-attr]
    for grant in grants:
        await grant.renew(0.0)
        await grant.release()
    await until(lambda: in_flight(host) == {}, "released")
    with pytest.raises(RouterError) as refused:
        await client.over(conn, Ask("nope", "x", "t"))
    assert refused.value.status in (400, 404)
    conn.close()


async def test_waiters_on_a_connection_that_drops_get_503_at_once(tmp_path: Path) -> None:
    """A router that dies (kill -9) closes the socket: every waiter hears 503 now."""
    path = tmp_path / "dying.sock"
    accepted: list[asyncio.StreamWriter] = []

    async def router(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framing.encode({"type": "link.hello", "boot": "b1", "protocol": 1}))
        accepted.append(writer)
        await reader.read()  # never answers

    server = await asyncio.start_unix_server(router, path=str(path))
    try:
        link = link_client.Link(Address("unix", str(path)))
        conn = await link.connect(Watch())  # type: ignore[arg-type]
        assert conn is not None
        client = Linked(Layer(InMemoryChannelLayer()))
        waits = [asyncio.ensure_future(client.over(conn, Ask("m", f"w{i}", "t"))) for i in range(5)]
        await until(lambda: len(conn.pending) == 5, "the five acquires to be sent")
        assert not any(w.done() for w in waits)
        accepted[0].transport.abort()  # what the kernel does for a killed router
        # Nothing but the close can answer them: the watch never loses the router, and the
        # first answer's own deadline (FIRST_ANSWER_CAP, 30 s) is longer than this wait.
        assert DEADLINE / 2 < FIRST_ANSWER_CAP
        results = await asyncio.wait_for(
            asyncio.gather(*waits, return_exceptions=True), DEADLINE / 2
        )
        for result in results:
            assert isinstance(result, RouterError) and result.status == 503
            assert result.body()["error"]["type"] == "unavailable_error"
            message = result.body()["error"]["message"]
            assert message.startswith("router unavailable: the connection to the router"), message
        assert not conn.open
        again = await link.connect(Watch())  # type: ignore[arg-type]
        assert again is not None and again is not conn  # reconnected, a new connection
        again.close()
    finally:
        server.close()


async def test_a_failed_connect_backs_off_and_the_channel_path_serves_meanwhile(
    tmp_path: Path,
) -> None:
    link = link_client.Link(Address("unix", str(tmp_path / "nobody.sock")))
    assert await link.connect(Watch()) is None  # type: ignore[arg-type]
    first = link._retry_at
    assert first > time.monotonic()
    assert await link.connect(Watch()) is None  # type: ignore[arg-type]
    assert link._retry_at == first  # no new attempt inside the back-off


async def test_waiters_get_503_when_the_heartbeat_says_the_router_froze(tmp_path: Path) -> None:
    """A frozen router keeps its socket open: the heartbeat watch answers the waiters."""
    path = tmp_path / "frozen.sock"

    async def router(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framing.encode({"type": "link.hello", "boot": "b1", "protocol": 1}))
        await reader.read()

    class Freezing(Watch):
        def __init__(self) -> None:
            super().__init__()
            self.dead = asyncio.Event()

        async def gone(self, boot: str | None) -> str:
            await self.dead.wait()
            return "no heartbeat from the router for 6 s"

    server = await asyncio.start_unix_server(router, path=str(path))
    try:
        watch = Freezing()
        conn = await link_client.Link(Address("unix", str(path))).connect(watch)  # type: ignore[arg-type]
        assert conn is not None
        client = Linked(Layer(InMemoryChannelLayer()))
        wait = asyncio.ensure_future(client.over(conn, Ask("m", "f", "t")))
        await asyncio.sleep(0.1)
        watch.dead.set()
        with pytest.raises(RouterError) as refused:
            await asyncio.wait_for(wait, 2)
        assert refused.value.status == 503 and "no heartbeat" in str(refused.value)
        assert conn.open  # same boot: the connection stays for the leases it carries
        conn.close()
    finally:
        server.close()


def test_the_unix_socket_of_this_host_else_the_tcp_address_is_used(settings: Any) -> None:
    import socket as socketlib

    from models_app.routing.liveness import Beat

    here = socketlib.gethostname()

    def watch_of(link: str, host: str, tcp: str = "") -> Any:
        beat = Beat("b", 1, host, time.time(), time.time(), link, tcp=tcp)
        return type("W", (), {"beat": beat})()

    unix, tcp = Address("unix", "/x/router.sock"), Address("tcp", host="10.0.0.2", port=7070)
    assert link_client.reachable(watch_of("unix:/x/router.sock", here)) == unix
    assert link_client.reachable(watch_of("unix:/x/router.sock", "elsewhere")) is None
    assert link_client.reachable(watch_of("unix:/x/router.sock", here, "tcp:10.0.0.2:7070")) == unix
    assert (
        link_client.reachable(watch_of("unix:/x/router.sock", "elsewhere", "tcp:10.0.0.2:7070"))
        == tcp
    )
    assert link_client.reachable(watch_of("tcp:10.0.0.2:7070", here)) is None  # not a socket
    assert link_client.reachable(watch_of("", here)) is None  # an older router: channels
    settings.ROUTERPANEL_ROUTER_LINK_VIA = "tcp"  # a container without the data volume
    link_client._reachable.clear()
    assert link_client.reachable(watch_of("unix:/x/router.sock", here, "tcp:10.0.0.2:7070")) == tcp
    settings.ROUTERPANEL_ROUTER_LINK = False
    link_client._reachable.clear()
    assert link_client.reachable(watch_of("unix:/x/router.sock", here, "tcp:10.0.0.2:7070")) is None
    link_client._reachable.clear()


def test_a_tcp_address_prints_an_ipv6_host_in_brackets() -> None:
    assert str(Address("tcp", host="::1", port=7070)) == "tcp:[::1]:7070"
    assert Address.parse(str(Address("tcp", host="::1", port=7070))) == Address(
        "tcp", host="::1", port=7070
    )


# ---- TCP (web processes on other hosts) -------------------------------------------------------


@pytest.fixture
async def tcp_host(tmp_path: Path) -> AsyncIterator[RouterHost]:
    await sync_to_async(save_two_sim_presets)()
    host = RouterHost(InMemoryChannelLayer(), state_file=tmp_path / "children.json")
    unix = Address("unix", str(framing.socket_path(tmp_path)))
    host.link = LinkServer(host.desk, unix, Address("tcp", host="127.0.0.1", port=0))
    await host.start()
    assert host.link.tcp_link.startswith("tcp:127.0.0.1:")
    yield host
    await asyncio.wait_for(host.stop(), DEADLINE)


async def test_a_web_process_that_knows_the_key_acquires_over_tcp(tcp_host: RouterHost) -> None:
    address = Address.parse(tcp_host.link.tcp_link)
    assert address is not None
    conn = await link_client.Link(address).connect(Watch())  # type: ignore[arg-type]
    assert conn is not None and conn.boot == tcp_host.boot
    client = Linked(Layer(InMemoryChannelLayer()))
    grant = await client.over(conn, Ask("m1", "tcp-1", "t"))
    assert in_flight(tcp_host) == {"m1": 1}
    await grant.release()
    await until(lambda: in_flight(tcp_host) == {}, "released over TCP")
    assert tcp_host.acquires["socket"] == 1 and tcp_host.link.refused == 0
    conn.close()


async def test_a_tcp_peer_without_the_key_is_refused_before_any_message(
    tcp_host: RouterHost,
) -> None:
    address = Address.parse(tcp_host.link.tcp_link)
    assert address is not None
    reader, writer = await asyncio.open_connection(address.host, address.port)
    hello = await read_message(reader)
    assert hello is not None and hello["type"] == "link.hello" and len(hello["nonce"]) == 32
    wrong = framing.proof(framing.link_key("another installation's key"), hello["nonce"])
    writer.write(framing.encode({"type": "link.auth", "proof": wrong}))
    writer.write(framing.encode(acquire("sneaky", "m1")))
    async with asyncio.timeout(DEADLINE):
        assert await read_message(reader) is None  # closed, nothing answered
    writer.close()
    # no proof at all: the first line is an acquire
    reader, writer = await asyncio.open_connection(address.host, address.port)
    await read_message(reader)
    writer.write(framing.encode(acquire("sneakier", "m1")))
    async with asyncio.timeout(DEADLINE):
        assert await read_message(reader) is None
    writer.close()
    assert tcp_host.link.refused == 2 and tcp_host.acquires["socket"] == 0
    assert in_flight(tcp_host) == {}


async def test_a_web_process_with_another_key_backs_off_to_the_channel_layer(
    tcp_host: RouterHost, settings: Any
) -> None:
    address = Address.parse(tcp_host.link.tcp_link)
    assert address is not None
    settings.SECRET_KEY = "not the router's secret key, but long enough to pass"
    link = link_client.Link(address)
    assert await link.connect(Watch()) is None  # type: ignore[arg-type]
    assert link._retry_at > time.monotonic()  # backs off; the channel layer serves meanwhile
    await until(lambda: tcp_host.link.refused == 1, "refused")


async def test_the_unix_socket_asks_no_proof(tcp_host: RouterHost) -> None:
    raw, hello = await Raw.open(tcp_host)
    assert "nonce" not in hello  # the socket's file mode admits only the router's user
    raw.send(acquire("local", "m1"))
    assert (await raw.until("local", "router.granted"))["type"] == "router.granted"
    raw.close()


def test_a_heartbeat_with_fields_this_version_does_not_know_still_parses() -> None:
    import json

    from models_app.routing.liveness import Beat

    old = {"boot": "b", "pid": 1, "host": "h", "time": 1.0, "started": 0.5}
    assert Beat.parse(json.dumps(old)) == Beat("b", 1, "h", 1.0, 0.5, "")
    newer = old | {"link": "unix:/s", "replicas": 2}
    assert Beat.parse(json.dumps(newer)) == Beat("b", 1, "h", 1.0, 0.5, "unix:/s")
    with_tcp = newer | {"tcp": "tcp:10.0.0.2:7070"}
    assert Beat.parse(json.dumps(with_tcp)).tcp == "tcp:10.0.0.2:7070"  # type: ignore[union-attr]
