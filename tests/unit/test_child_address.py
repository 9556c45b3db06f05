"""``ChildAddress``: how a caller reaches one child, and how its key stays out of sight (#18)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from routerpanel.router.address import ChildAddress, new_key, shown
from routerpanel.router.config import RouterConfig
from tests.support.engine import FakeClock, Harness, make, shut_down
from tests.support.waits import settled


class TestAddress:
    def test_the_url_brackets_an_ipv6_host(self) -> None:
        assert ChildAddress("127.0.0.1", 8080).url == "http://127.0.0.1:8080"
        assert ChildAddress("10.1.2.3", 9).url == "http://10.1.2.3:9"
        assert ChildAddress("::1", 8080).url == "http://[::1]:8080"
        assert ChildAddress("[fd00::5]", 81).url == "http://[fd00::5]:81"

    def test_a_keyed_child_gets_its_key_as_a_bearer_token(self) -> None:
        assert ChildAddress("127.0.0.1", 1).headers() == {}
        assert ChildAddress("127.0.0.1", 1, "k").headers() == {"Authorization": "Bearer k"}

    def test_the_probe_request_carries_the_key_only_when_there_is_one(self) -> None:
        plain = ChildAddress("::1", 5).get("/health")
        assert plain == b"GET /health HTTP/1.1\r\nHost: [::1]:5\r\nConnection: close\r\n\r\n"
        keyed = ChildAddress("10.0.0.1", 5, "s3cret").get("/slots")
        assert b"\r\nAuthorization: Bearer s3cret\r\n" in keyed
        assert keyed.startswith(b"GET /slots HTTP/1.1\r\n") and keyed.endswith(b"\r\n\r\n")

    def test_the_key_is_not_in_its_repr_but_tells_two_children_apart(self) -> None:
        key = new_key()
        address = ChildAddress("10.0.0.1", 8080, key)
        assert key not in repr(address) and key not in str(address)
        assert address != ChildAddress("10.0.0.1", 8080, new_key())  # a new spawn: a new pool
        assert address == ChildAddress("10.0.0.1", 8080, key)
        assert len({address, ChildAddress("10.0.0.1", 8080, key)}) == 1


class TestKeys:
    def test_every_key_is_new_and_long(self) -> None:
        keys = {new_key() for _ in range(100)}
        assert len(keys) == 100
        assert all(len(k) >= 40 and k.isascii() and "," not in k for k in keys)


class TestShown:
    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (["srv", "--api-key", "k1", "-m", "x"], ["srv", "--api-key", "***", "-m", "x"]),
            (["srv", "--api-key=k1,k2"], ["srv", "--api-key=***"]),
            (["srv", "--api-key"], ["srv", "--api-key"]),  # nothing to mask
            (["srv", "--api-key-file", "/d/f"], ["srv", "--api-key-file", "/d/f"]),  # a path
            (["srv", "-m", "--api-key"], ["srv", "-m", "--api-key"]),
            ([], []),
        ],
    )
    def test_a_key_on_the_command_line_is_masked(
        self, argv: list[str], expected: list[str]
    ) -> None:
        assert shown(argv) == expected

    def test_it_takes_any_iterable(self) -> None:
        assert shown(("a", "--api-key", "k")) == ["a", "--api-key", "***"]


class TestConfig:
    def test_children_listen_on_loopback_without_keys_unless_told(self) -> None:
        config = RouterConfig()
        assert (config.child_host, config.child_keys) == ("127.0.0.1", False)
        assert RouterConfig(child_host="10.0.0.1", child_keys=True).child_keys

    @pytest.mark.parametrize("fields", [{"child_host": ""}, {"child_keys": "yes"}])
    def test_bad_values_are_refused_where_they_are_made(self, fields: dict) -> None:
        with pytest.raises(ValueError, match="child_"):
            RouterConfig(**fields)


class TestEngine:
    """The engine hands the child's address to the caller that holds the lease, and to no one
    else: not the snapshot, not the events (FakeSupervisor keys a keyed spawn ``key-NAME-PID``)."""

    async def test_a_lease_carries_the_childs_host_and_key_and_nothing_else_does(self) -> None:
        engine, sup, _ = await make("a", start=False, child_host="10.9.8.7", child_keys=True)
        sub = engine.subscribe(maxsize=10_000)
        events: list[Any] = []

        async def collect() -> None:
            async for event in sub:
                events.append(event)

        collector = asyncio.create_task(collect())
        await engine.start()
        h = Harness(engine, sup, FakeClock())
        task = h.acquire("a")
        await h.idle()
        sup.ready("a")
        await h.idle()
        lease = await settled(task)
        key = f"key-a-{sup.children['a']}"
        assert (lease.host, lease.key, lease.port) == ("10.9.8.7", key, sup.port("a"))
        assert lease.address == ChildAddress("10.9.8.7", sup.port("a"), key)
        assert key not in repr(lease)
        snapshot = json.dumps(engine.snapshot())
        assert key not in snapshot and "10.9.8.7" in snapshot  # args: --host 10.9.8.7
        engine.release(lease.lease_id)
        unloading = asyncio.create_task(engine.unload("a"))
        await h.idle()
        await h.exit("a")  # unloaded; the next spawn gets a new key
        await settled(unloading)
        again = h.acquire("a")
        await h.idle()
        sup.ready("a")
        await h.idle()
        second = await settled(again)
        assert second.key == f"key-a-{sup.children['a']}" != key
        await h.idle()
        assert events and not any(key in json.dumps(e.data, default=str) for e in events)
        collector.cancel()
        await shut_down(h)

    async def test_without_child_keys_a_lease_has_no_key(self) -> None:
        engine, sup, _ = await make("a")
        h = Harness(engine, sup, FakeClock())
        task = h.acquire("a")
        await h.idle()
        sup.ready("a")
        await h.idle()
        lease = await settled(task)
        assert (lease.host, lease.key) == ("127.0.0.1", None)
        await shut_down(h)
