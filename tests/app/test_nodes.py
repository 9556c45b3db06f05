"""Several hosts (issue 18), the web side's part: names, the directory, placement from beats,
the merged snapshot and metrics, the peer watch and the audit rows of nodes.

The services tier runs the same with two real ``runrouter --node`` processes
(tests/services/test_nodes.py); these check each piece with its inputs spelled out.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from models_app.audit.mapper import AuditMapper
from models_app.routing import liveness, nodes, topology
from routerpanel.router.catalogue import Event
from routerpanel.router.feed import EngineEvent


def status(*models: dict[str, Any], models_max: int = 1, memory: int | None = None) -> dict:
    running = sum(1 for m in models if m.get("state") not in ("unloaded", None))
    return {
        "models_max": models_max,
        "running": running,
        "memory_available": memory,
        "models": list(models),
        "known": ["a", "b", "c"],
        "aliases": {"alpha": "a"},
    }


def node(name: str, st: dict[str, Any], live: bool = True) -> nodes.Node:
    return nodes.Node(name, live, time.time(), f"boot-{name}", "host", 1, "127.0.0.2", st)


class TestNames:
    def test_the_unnamed_router_keeps_the_channel_and_keys_of_one_host(self) -> None:
        assert topology.channel("") == "router"
        assert topology.heartbeat_key("").endswith(":router:heartbeat")
        assert topology.lock_key("").endswith(":router:lock")

    def test_a_node_has_a_channel_and_keys_of_its_own(self) -> None:
        assert topology.channel("studio-1") == "router.studio-1"
        assert topology.heartbeat_key("studio-1").endswith(":node:studio-1:heartbeat")
        assert topology.lock_key("studio-1") != topology.lock_key("studio-2")

    @pytest.mark.parametrize("bad", ["a b", "a:b", "ü", "x" * 65, "a,b"])
    def test_a_name_that_cannot_be_a_channel_or_key_is_refused(self, bad: str) -> None:
        with pytest.raises(ValueError, match="node"):
            topology.check_name(bad)

    def test_runrouter_refuses_a_bad_node_name_before_it_starts(self) -> None:
        from django.core.management import call_command
        from django.core.management.base import CommandError

        with pytest.raises((CommandError, SystemExit)):
            call_command("runrouter", "--node", "no spaces")


class TestDirectory:
    def test_a_fresh_beat_is_live_a_stale_or_expired_one_lost(self) -> None:
        now = 1000.0
        fresh = liveness.Beat("b1", 1, "h1", now - 1, 0, node="n1", status={"models_max": 2})
        stale = liveness.Beat("b2", 2, "h2", now - 7, 0, node="n2")
        found = nodes.directory_from(
            {"n3": now - 30, "n1": now - 1, "n2": now - 7},
            [None, fresh, stale],
            dead_after=6,
            now=now,
        )
        assert [(n.name, n.live) for n in found] == [("n1", True), ("n2", False), ("n3", False)]
        assert found[0].as_json(now)["models_max"] == 2
        assert found[2].as_json(now)["beat_age"] == 30  # expired key: lost since its last beat

    async def test_nodes_beat_into_the_directory_and_forget_drops_a_lost_one(
        self, settings: Any, redis_prefix: str
    ) -> None:
        beat = liveness.Heartbeat("boot-1", node="n1", advertise="127.0.0.2",
                                  status=lambda: {"models_max": 3})  # fmt: skip
        client = liveness.redis_client()
        try:
            assert await beat.beat(client)
            found = await nodes.directory(client)
            assert [(n.name, n.live, n.advertise) for n in found] == [("n1", True, "127.0.0.2")]
            assert found[0].status == {"models_max": 3}
            assert not await nodes.forget(client, "n1")  # still beating: kept
            await client.delete(topology.heartbeat_key("n1"))
            assert await nodes.forget(client, "n1")
            assert await nodes.directory(client) == []
        finally:
            await client.aclose()


class TestPlacement:
    def test_a_request_goes_where_its_model_is_loaded(self) -> None:
        found = [
            node("n1", status()),
            node("n2", status({"name": "a", "state": "loaded", "last_used": 5.0})),
        ]
        assert nodes.place("a", found) == "n2"
        assert nodes.place("alpha", found) == "n2"  # an alias: its preset's name

    def test_a_model_just_started_counts_as_loading_on_its_node(self) -> None:
        found = [node("n1", status()), node("n2", status(memory=10))]
        assert nodes.place("b", found) == "n2"  # both free: more memory
        assert nodes.place("b", found, started={"a": "n2"}) == "n1"  # n2's slot is taken
        assert nodes.place("a", found, started={"a": "n1"}) == "n1"  # where it is starting

    def test_a_free_slot_first_then_the_least_recently_used_victim(self) -> None:
        found = [
            node("n1", status({"name": "a", "state": "loaded", "last_used": 9.0})),
            node("n2", status()),
        ]
        assert nodes.place("b", found) == "n2"
        full = [
            node("n1", status({"name": "a", "state": "loaded", "last_used": 9.0})),
            node("n2", status({"name": "b", "state": "loaded", "last_used": 3.0})),
        ]
        assert nodes.place("c", full) == "n2"  # b was used longest ago
        busy = [
            node("n1", status({"name": "a", "state": "loaded", "last_used": 9.0})),
            node("n2", status({"name": "b", "state": "loaded", "last_used": 3.0, "in_flight": 1})),
        ]
        assert nodes.place("c", busy) == "n1"  # n2's only model is busy: no victim there

    def test_a_lost_node_is_never_chosen_and_none_left_is_a_clear_error(self) -> None:
        loaded = status({"name": "a", "state": "loaded"})
        found = [node("n1", loaded, live=False), node("n2", status())]
        assert nodes.place("a", found) == "n2"
        with pytest.raises(nodes.NoPlace, match="lost: n1"):
            nodes.place("a", [node("n1", loaded, live=False)])
        with pytest.raises(nodes.NoPlace, match="no node serves model 'zz'"):
            nodes.place("zz", found)

    def test_only_nodes_that_know_the_preset_are_eligible(self) -> None:
        only_b = status() | {"known": ["b"], "aliases": {}}
        found = [node("n1", only_b), node("n2", status({"name": "c", "state": "loaded"}))]
        assert nodes.place("a", found) == "n2"  # n1 is free, but a's preset names n2 only

    async def test_two_placements_of_a_cold_model_within_one_read_agree(
        self, settings: Any, redis_prefix: str
    ) -> None:
        """The directory is up to a quarter second old: a claim in Redis keeps two requests
        (or two web processes) from starting the same model on two nodes."""
        first = [node("n1", status()), node("n2", status(memory=10))]
        assert await nodes.place_claimed("a", first) == "n2"  # more memory left
        second = [node("n1", status(memory=99)), node("n2", status(memory=10))]
        assert nodes.place("a", second) == "n1"  # what the rule alone would say now
        assert await nodes.place_claimed("a", second) == "n2"  # this process started it there
        nodes._cache().started.clear()  # as another web process, which did not
        assert await nodes.place_claimed("a", second) == "n2"  # the claim in Redis holds
        nodes._caches.clear()

    async def test_cold_models_placed_at_once_take_the_free_slots_of_different_nodes(
        self, settings: Any, redis_prefix: str
    ) -> None:
        """A burst: requests for two cold models placed concurrently, while the claim of the
        first is still on its way to Redis, go to the two free slots, not both to one node."""
        import asyncio

        free = [node("n1", status()), node("n2", status())]
        placed = await asyncio.gather(*(nodes.place_claimed(m, free) for m in "ab"))
        assert sorted(placed) == ["n1", "n2"], placed
        again = await asyncio.gather(*(nodes.place_claimed(m, free) for m in "abab"))
        assert again == placed * 2  # each keeps the node it was started on
        nodes._caches.clear()

    async def test_a_copy_being_stopped_does_not_hold_its_model_and_a_new_start_is_claimed(
        self, settings: Any, redis_prefix: str
    ) -> None:
        """What a node holds is placement's P1 alone: a copy being stopped does not count, so
        starting the model elsewhere is claimed as any cold start is; a loaded copy is not."""
        loaded = [node("n1", status({"name": "a", "state": "loaded"})), node("n2", status())]
        assert await nodes.place_claimed("a", loaded) == "n1"
        assert "a" not in nodes._cache().started  # held: nothing starts, nothing claimed
        stopping = {"name": "a", "state": "loaded", "stopping": True}
        first = [node("n1", status(stopping)), node("n2", status(memory=10))]
        assert await nodes.place_claimed("a", first) == "n2"  # n1's one slot is taken
        nodes._cache().started.clear()  # as another web process, once n1's copy has gone
        second = [node("n1", status(memory=99)), node("n2", status(memory=10))]
        assert nodes.place("a", second) == "n1"  # what the rule alone would say now
        assert await nodes.place_claimed("a", second) == "n2"  # the claim in Redis holds
        nodes._caches.clear()


class TestMerged:
    def test_a_model_known_to_two_nodes_is_listed_once_with_where_it_runs(self) -> None:
        snaps = {
            "n1": {"seq": 4, "models": [{"name": "a", "state": "unloaded"}], "queue": [],
                   "config": {"models_max": 1}},
            "n2": {"seq": 9, "models": [{"name": "a", "state": "loaded", "pid": 7}],
                   "queue": [{"model": "b", "waiters": 1}], "config": {"models_max": 1}},
        }  # fmt: skip
        merged = nodes.merge_snapshots(snaps, [node("n1", {}), node("n2", {})])
        assert merged["models"] == [
            {"name": "a", "state": "loaded", "pid": 7, "node": "n2", "nodes": ["n1", "n2"]}
        ]
        assert merged["queue"] == [{"model": "b", "waiters": 1, "node": "n2"}]
        assert merged["seqs"] == {"n1": 4, "n2": 9}
        assert [n["node"] for n in merged["nodes"]] == ["n1", "n2"]

    def test_a_lost_nodes_models_show_as_lost_with_it_unless_they_run_elsewhere(self) -> None:
        snaps = {
            "n2": {
                "seq": 1,
                "models": [{"name": "a", "state": "unloaded"}, {"name": "b", "state": "loaded"}],
                "queue": [],
            }
        }
        ran = status({"name": "a", "state": "loaded"}, {"name": "b", "state": "loaded"})
        merged = nodes.merge_snapshots(snaps, [node("n1", ran, live=False), node("n2", {})])
        by_name = {m["name"]: m for m in merged["models"]}
        assert by_name["a"]["lost_on"] == "n1" and by_name["a"]["node"] is None
        assert "lost_on" not in by_name["b"] and by_name["b"]["node"] == "n2"

    def test_metrics_of_several_nodes_gain_a_node_label(self) -> None:
        family = {"name": "loads_total", "type": "counter", "help": "h"}
        answers = {
            "n1": {"metrics": [family | {"samples": [("", {"model": "a"}, 2.0)]}]},
            "n2": {"metrics": [family | {"samples": [("", {"model": "a"}, 1.0)]}]},
        }
        merged = nodes.merge_metrics(answers)["metrics"]
        samples = [("", {"model": "a", "node": "n1"}, 2.0), ("", {"model": "a", "node": "n2"}, 1.0)]
        assert merged == [family | {"samples": samples}]


class FakeRedis:
    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    async def set(self, key: str, value: str, nx: bool = False, ex: int = 0) -> bool:
        if nx and key in self.keys:
            return False
        self.keys[key] = value
        return True


class TestPeerWatch:
    async def test_a_node_seen_live_then_lost_is_told_once_among_all_watchers(
        self, settings: Any
    ) -> None:
        told: list[dict[str, Any]] = []
        redis = FakeRedis()
        watchers = [nodes.PeerWatch(me, told.append) for me in ("n1", "n3")]
        running = status({"name": "a", "state": "loaded"})
        for watcher in watchers:
            await watcher.check(redis, [node("n1", {}), node("n2", running), node("n3", {})])
        lost = nodes.Node("n2", False, time.time() - 8)
        for watcher in watchers:
            await watcher.check(redis, [node("n1", {}), lost, node("n3", {})])
            await watcher.check(redis, [node("n1", {}), lost, node("n3", {})])
        assert len(told) == 1
        assert told[0]["node"] == "n2" and told[0]["change"] == "lost"
        assert told[0]["models"] == ["a"] and told[0]["silent_for"] >= 8


class TestAuditRows:
    def rows(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        mapper = AuditMapper(out.append)
        mapper.feed(EngineEvent(1, Event.NODE_CHANGED, time.time(), data))
        return out

    def test_a_lost_node_is_audited_with_its_name_and_models(self) -> None:
        (row,) = self.rows({"node": "n2", "change": "lost", "host": "mac-2", "models": ["a"],
                            "silent_for": 8.0, "lost_for": None})  # fmt: skip
        assert row["kind"] == "node_lost" and row["node"] == "n2"
        assert "stopped beating 8 s ago" in row["reason"] and "running: a" in row["reason"]

    def test_a_returning_node_says_after_how_long(self) -> None:
        (row,) = self.rows({"node": "n2", "change": "joined", "host": "mac-2", "models": ["a"],
                            "silent_for": None, "lost_for": 42.0})  # fmt: skip
        assert row["kind"] == "node_joined" and "returned after 42 s" in row["reason"]


@pytest.fixture
def redis_prefix(settings: Any, redis_url: str) -> str:
    """This worker's own Redis (emptied), under a prefix of this test's own."""
    import uuid

    settings.REDIS_URL = redis_url
    settings.ROUTERPANEL_REDIS_PREFIX = f"test-nodes-{uuid.uuid4().hex[:8]}"
    nodes._caches.clear()
    return str(settings.ROUTERPANEL_REDIS_PREFIX)


def test_the_audit_row_of_a_node_is_stored_with_its_node(db: Any) -> None:
    from models_app.audit.writer import store_rows
    from models_app.models import AuditEvent

    rows = TestAuditRows().rows({"node": "n2", "change": "joined", "host": "h", "models": [],
                                  "silent_for": None, "lost_for": None})  # fmt: skip
    rows[0]["router_id"] = "r1"
    store_rows(rows)
    stored = AuditEvent.objects.get(kind="node_joined")
    assert stored.node == "n2" and stored.get_kind_display() == "node joined"
    assert json.loads(json.dumps(stored.details))["node"] == "n2"


class TestReservationsOnNodes:
    async def test_a_booked_model_goes_to_one_node_and_every_node_gets_its_set(
        self, monkeypatch: pytest.MonkeyPatch, settings: Any, redis_prefix: str
    ) -> None:
        """Not to every node that may run it: it would be loaded on both in advance."""
        from models_app.routing.client import RouterClient
        from models_app.routing.linked import Linked

        found = [node("n1", status()), node("n2", status(memory=10)), node("n3", {}, live=False)]

        async def known() -> list[nodes.Node]:
            return found

        sent: dict[str, dict[str, Any]] = {}

        async def call_remote(linked: Linked, call: dict[str, Any]) -> dict[str, Any]:
            sent[linked.node] = call["reservations"]
            return {"reserved": sorted(call["reservations"]), "loading": [], "unknown": []}

        monkeypatch.setattr(nodes, "known", known)
        monkeypatch.setattr(Linked, "call", call_remote)
        answer = await RouterClient().set_reservations({"a": ["group:ws"]}, actor="tick")
        assert sent == {"n1": {}, "n2": {"a": ["group:ws"]}}  # n2: more memory; n3 is lost
        assert answer == {"reserved": ["a"], "loading": [], "unknown": []}

    async def test_a_queued_request_is_cancelled_on_whichever_node_holds_it(
        self, monkeypatch: pytest.MonkeyPatch, settings: Any, redis_prefix: str
    ) -> None:
        from models_app.routing.client import RouterClient
        from models_app.routing.linked import Linked

        async def live_names() -> list[str]:
            return ["n1", "n2"]

        async def call_remote(linked: Linked, call: dict[str, Any]) -> dict[str, Any]:
            mine = ["r-7"] if linked.node == "n2" else []
            return {"success": True, "cancelled": mine}

        monkeypatch.setattr(nodes, "live_names", live_names)
        monkeypatch.setattr(Linked, "call", call_remote)
        answer = await RouterClient().cancel_queued(actor="user:ada", queued_request="r-7")
        assert answer == {"success": True, "cancelled": ["r-7"]}
