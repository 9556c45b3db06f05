"""Several hosts behind one panel (issue 18): each router is a node, known through Redis.

A router started with ``runrouter --node NAME`` is the node NAME: it listens on its own channel
(``router.NAME``), holds its own lock (one router per node name, on any host) and writes its own
heartbeat, which carries what placement needs — the address its children listen on, its
capacity, its memory and its models. It also adds its name to the installation's set of nodes,
so that a node that stops beating is still known, and shown as lost, until an operator forgets
it. The single router of a one-host installation has no name: channel ``router``, the keys of
before, nothing in the set — a one-host installation does not change.

Here: the directory web processes read, placement and the merged views. The names, keys and
channels are ``topology.py``; the liveness of one router (the beat, the watch) is
``liveness.py``; the lock is ``locks.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from models_app.routing import liveness
from models_app.routing.singleflight import SingleFlight
from models_app.routing.topology import heartbeat_key, members_key
from routerpanel.router import placement
from routerpanel.router.states import DOWN

log = logging.getLogger(__name__)
DOWN_NAMES = frozenset(state.value for state in DOWN)


@dataclass(frozen=True)
class Node:
    """One node as web processes see it: its last beat, and whether that beat is fresh."""

    name: str
    live: bool
    seen: float | None = None  # wall clock of the last beat; None: never seen (key expired)
    boot: str = ""
    host: str = ""
    pid: int = 0
    advertise: str = ""
    status: dict[str, Any] = field(default_factory=dict)

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        age = None if self.seen is None else round((now or time.time()) - self.seen, 1)
        return {
            "node": self.name,
            "state": "live" if self.live else "lost",
            "beat_age": age,
            "boot": self.boot,
            "host": self.host,
            "pid": self.pid,
            "advertise": self.advertise,
            **{k: self.status.get(k) for k in ("models_max", "running", "memory_available")},
            "models": self.status.get("models", []),
        }


def directory_from(
    members: dict[str, float | None],
    beats: list[Any],
    *,
    dead_after: float,
    now: float | None = None,
) -> list[Node]:
    """The nodes from their last-beat times (``members``, by name) and their parsed beats
    (``liveness.Beat`` or None, in the same order), by name."""
    now = time.time() if now is None else now
    out = []
    for (name, last), beat in sorted(zip(members.items(), beats, strict=True)):
        if beat is None:  # its beat key expired: lost since ``last``
            out.append(Node(name, live=False, seen=last))
            continue
        live = now - beat.time < dead_after
        out.append(Node(name, live, beat.time, beat.boot, beat.host, beat.pid, beat.advertise,
                        dict(beat.status or {})))  # fmt: skip
    return out


async def directory(client: Any, *, dead_after: float | None = None) -> list[Node]:
    """Every named node of this installation, live or lost, read from Redis by ``client``."""

    members = _members(await client.hgetall(members_key()))
    if not members:
        return []
    raws = await client.mget([heartbeat_key(n) for n in members])
    beats = [liveness.Beat.parse(raw) for raw in raws]
    after = liveness.DEAD_AFTER if dead_after is None else dead_after
    return directory_from(members, beats, dead_after=after)


def _members(raw: dict[Any, Any]) -> dict[str, float | None]:
    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    out: dict[str, float | None] = {}
    for name, last in raw.items():
        try:
            out[text(name)] = float(text(last))
        except ValueError:
            out[text(name)] = None
    return out


async def forget(client: Any, node: str) -> bool:
    """Drop a lost node from the set (an operator's decision); False if it still beats."""

    beat = liveness.Beat.parse(await client.get(heartbeat_key(node)))
    if beat is not None and time.time() - beat.time < liveness.DEAD_AFTER:
        return False
    await client.hdel(members_key(), node)
    return True


async def last_seen(client: Any, node: str) -> float | None:
    """The wall clock of ``node``'s last beat here; None if it never beat (or was forgotten)."""
    raw = await client.hget(members_key(), node)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


class PeerWatch:
    """A node's watch of the other nodes (issue 18.4): when one it saw live stops beating, it
    tells ``note`` once — once in the whole installation, by a claim in Redis per lost boot, so
    that of several watching nodes only one audits the loss."""

    def __init__(self, me: str, note: Callable[[dict[str, Any]], None], every: float = 1.0):
        self.me, self.note, self.every = me, note, every
        self.live: dict[str, Node] = {}  # the other nodes last seen live

    async def run(self) -> None:

        client = liveness.redis_client()
        try:
            while True:
                try:
                    await self.check(client, await directory(client))
                except Exception as exc:  # Redis away: nothing to tell, nothing to lose
                    log.debug("peer watch: %s", exc)
                await asyncio.sleep(self.every)
        finally:
            await client.aclose()

    async def check(self, client: Any, found: list[Node]) -> None:
        for node in found:
            if node.name == self.me:
                continue
            if node.live:
                self.live[node.name] = node
                continue
            seen = self.live.pop(node.name, None)
            if seen is None:
                continue
            claim = f"{settings.ROUTERPANEL_REDIS_PREFIX}:node:{node.name}:lost:{seen.boot}"
            if await client.set(claim, self.me, nx=True, ex=LOST_CLAIM_SECONDS):
                running = [m["name"] for m in seen.status.get("models", ()) if m.get("name")]
                silent = None if node.seen is None else round(time.time() - node.seen, 1)
                self.note({"node": node.name, "change": "lost", "host": seen.host,
                           "models": running, "silent_for": silent, "lost_for": None})  # fmt: skip


LOST_CLAIM_SECONDS = 7 * 24 * 3600


# ---- what web processes use: the directory, cached per event loop; placement; the snapshot ----

# Seconds a web process reuses the directory it read: nodes beat every second and at once when
# a model changes state, so a read this old misses at most the last quarter second.
DIRECTORY_TTL = 0.25


class NoPlace(Exception):
    """No live node may run the model; the message names the nodes and why."""


class _Cache:
    def __init__(self) -> None:
        self.read_at = -math.inf
        self.nodes: list[Node] = []
        # Cold models this process placed lately -> (node, until): counted as loading there
        # until the node's beat shows them, so the next request does not place by a stale read.
        self.started: dict[str, tuple[str, float]] = {}
        self.reading: SingleFlight[list[Node]] = SingleFlight()
        self.client: Any = None


_caches: dict[int, _Cache] = {}


def _cache() -> _Cache:
    loop = asyncio.get_running_loop()
    cache = _caches.get(id(loop))
    if cache is None:
        cache = _caches[id(loop)] = _Cache()
    return cache


async def known() -> list[Node]:
    """The directory (every named node, live or lost), at most ``DIRECTORY_TTL`` old; [] without
    Redis or when no node ever beat (the unnamed router serves)."""
    if not settings.REDIS_URL:
        return []
    cache = _cache()
    if time.monotonic() - cache.read_at < DIRECTORY_TTL:
        return cache.nodes
    return await cache.reading.run(lambda: _read(cache))


async def _read(cache: _Cache) -> list[Node]:

    if cache.client is None:
        cache.client = liveness.redis_client(timeout=1.0)
    try:
        cache.nodes = await directory(cache.client)
    except Exception as exc:  # Redis away: the channel layer is too; requests fail there
        log.debug("node directory unreadable: %s", exc)
    cache.read_at = time.monotonic()
    return cache.nodes


async def lost(node: str) -> bool:
    """Whether ``node`` is lost now, read afresh (not from the cached directory)."""
    _cache().read_at = -math.inf
    return any(n.name == node and not n.live for n in await known())


async def live_names() -> list[str]:
    return [node.name for node in await known() if node.live]


def place(model: str | None, directory: list[Node], started: dict[str, str] | None = None) -> str:
    """The node a request for ``model`` goes to, by placement.py's rule; ``model`` None (a call
    about no model): the first live node. ``started``: models just placed (model -> node), as
    loading there when the beats do not show them yet. Raises ``NoPlace``."""
    return _place(model, directory, started).node


def _place(
    model: str | None, directory: list[Node], started: dict[str, str] | None
) -> placement.Placement:
    live = [node for node in directory if node.live]
    if model is None:
        if not live:
            raise NoPlace(_nobody(directory))
        return placement.Placement(live[0].name, "a call about no model", held=False)
    eligible = [node.name for node in directory if serves(node, model)]
    if not eligible:
        raise NoPlace(f"no node serves model {model!r} ({_nobody(directory)})")
    views = [view(node, started) for node in directory]
    try:
        return placement.place(canonical(directory, model), eligible, views)
    except placement.NoEligibleNode as exc:
        raise NoPlace(str(exc)) from None


async def place_claimed(model: str | None, directory: list[Node]) -> str:
    """``place``, and for a model no live node holds yet, a claim in Redis for a few seconds:
    two web processes (or two requests within one directory read) that place the same cold
    model at once send it to the same node, so it is never loaded on two by accident."""
    cache = _cache()
    now = time.monotonic()
    cache.started = {m: (n, until) for m, (n, until) in cache.started.items() if until > now}
    started = {m: n for m, (n, _) in cache.started.items()}
    chosen = _place(model, directory, started)
    if model is None or chosen.held:  # a node holds it already (P1): nothing to start
        return chosen.node
    name = canonical(directory, model)
    if name in started:  # this process claimed it a moment ago (``chosen`` is that node):
        return chosen.node  # no second claim until the claim expires or a beat shows it
    # Counted as started there before the claim's round trip: requests placed meanwhile (a
    # burst) see this slot taken and go to another node's free slot.
    cache.started[name] = (chosen.node, now + CLAIM_SECONDS)
    node = await _claim(cache, name, chosen.node, directory)
    if node != chosen.node:  # another process claimed it first: it starts there
        cache.started[name] = (node, now + CLAIM_SECONDS)
    return node


async def _claim(cache: _Cache, model: str, node: str, directory: list[Node]) -> str:
    """Claim ``model`` for ``node`` in Redis; the node claimed first if another process won."""
    key = f"{settings.ROUTERPANEL_REDIS_PREFIX}:placement:{model}"
    if cache.client is None:
        cache.client = liveness.redis_client(timeout=1.0)
    client = cache.client
    try:
        if await client.set(key, node, nx=True, px=int(CLAIM_SECONDS * 1000)):
            return node
        raw = await client.get(key)
    except Exception:  # Redis away: the channel layer is too; the request fails there
        return node
    claimed = raw.decode() if isinstance(raw, bytes) else str(raw or "")
    return claimed if any(n.name == claimed and n.live for n in directory) else node


CLAIM_SECONDS = 5.0  # longer than a beat's period: by then the claimed node's beat shows it


def serves(node: Node, model: str) -> bool:
    """Whether ``node`` knows ``model`` (a preset eligible there, by name or alias)."""
    return model in node.status.get("known", ()) or model in (node.status.get("aliases") or {})


def canonical(directory: list[Node], model: str) -> str:
    """The preset name of ``model`` (an alias is resolved by the first node that knows it)."""
    for node in directory:
        name = (node.status.get("aliases") or {}).get(model)
        if name:
            return str(name)
    return model


def view(node: Node, started: dict[str, str] | None = None) -> placement.NodeView:
    """What placement.py needs of a node, from its beat's status (worker.node_status), with
    the models just ``started`` there that its beat does not show yet."""
    status = node.status
    models = {
        str(m["name"]): placement.ModelView(
            state=str(m.get("state") or "unloaded"),
            stopping=bool(m.get("stopping")),
            queued=bool(m.get("queue_waiters")),
            last_used=float(m.get("last_used") or 0.0),
            busy=bool(m.get("in_flight")),
            pinned=bool(m.get("pinned")),
        )
        for m in status.get("models", ())
    }
    running = int(status.get("running") or 0)
    for model, where in (started or {}).items():
        if where == node.name and models.get(model, placement.ModelView()).state == "unloaded":
            models[model] = placement.ModelView(state="loading")
            running += 1
    return placement.NodeView(
        node.name,
        node.live,
        int(status.get("models_max") or 0),
        running,
        status.get("memory_available"),
        models,
    )


def _nobody(directory: list[Node]) -> str:
    lost = [node.name for node in directory if not node.live]
    return "no node is live" + (f"; lost: {', '.join(lost)}" if lost else "")


def merge_snapshots(snaps: dict[str, Any], directory: list[Node]) -> dict[str, Any]:
    """One snapshot of several nodes. A model known to several nodes is listed once: the entry
    of the node it runs on (else the first node's), with ``node`` (where it runs, or None) and
    ``nodes`` (every node that may run it). Queue entries carry their ``node``; the config is
    the first node's; ``nodes`` lists every node, live and lost, for the header."""
    first = next(iter(snaps.values()))
    chosen: dict[str, dict[str, Any]] = {}
    where: dict[str, list[str]] = {}
    queue = []
    for node, snap in snaps.items():
        for model in snap.get("models", []):
            name = model["name"]
            where.setdefault(name, []).append(node)
            up = model.get("state") not in DOWN_NAMES
            if name not in chosen or (up and chosen[name]["node"] is None):
                chosen[name] = {**model, "node": node if up else None}
        queue += [{**entry, "node": node} for entry in snap.get("queue", [])]
    # A lost node's models (from its last beat) that run nowhere else show as lost with it.
    for lost in (n for n in directory if not n.live):
        for entry in lost.status.get("models", ()):
            model = chosen.get(str(entry.get("name")))
            if model is not None and model["node"] is None and entry.get("state") != "unloaded":
                model["lost_on"] = lost.name
    models = [{**model, "nodes": where[name]} for name, model in chosen.items()]
    merged = dict(first)
    merged.update(models=models, queue=queue, seq=max(s.get("seq", 0) for s in snaps.values()))
    merged["seqs"] = {node: snap.get("seq", 0) for node, snap in snaps.items()}  # live.js
    merged["nodes"] = [node.as_json() for node in directory]
    return merged


def merge_metrics(answers: dict[str, Any]) -> dict[str, Any]:
    """The metric families of several nodes as one set: each sample gains a ``node`` label."""
    families: dict[str, dict[str, Any]] = {}
    for node, answer in answers.items():
        for family in answer.get("metrics") or ():
            merged = families.setdefault(family["name"], {**family, "samples": []})
            merged["samples"] += [
                (suffix, {**labels, "node": node}, value)
                for suffix, labels, value in family["samples"]
            ]
    return {"metrics": list(families.values())}
