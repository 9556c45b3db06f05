"""Which node a request goes to, when several hosts each run a router (issue 18, DESIGN §10).

Pure and framework-free: the caller (the web side) passes what it knows of every node, as
``NodeView``s built from the nodes' snapshots, and gets a ``Placement`` back, or a
``NoEligibleNode`` error. No I/O, no clock: ``last_used`` values are compared, never read.

A preset may name the nodes it may run on (``PresetSpec.nodes``, the INI key ``node``); empty
means any node. A router started with ``runrouter --node NAME`` only knows the presets eligible
on NAME (``eligible``); each node keeps llama.cpp's queue semantics for its own slots. The rule,
in order:

P1 **Where it is.** An eligible live node that holds the model wins: it is ``loaded`` or
   ``sleeping`` there (and not stopping), else ``loading``, else requests already wait for it
   there (it is being started). Several such nodes (which should not happen) are taken in that
   order, then by name. This is what keeps a model from being loaded on two nodes by accident:
   while any eligible live node holds it, no other node is ever chosen.
P2 **A free slot.** Otherwise, among the eligible live nodes, those with a free slot
   (``running < models_max``; ``models_max <= 0`` is unlimited) come first.
P3 **Most memory left.** Ties, and the case where no node has a free slot, go to the node with
   the most ``memory_available`` (unknown counts as least).
P4 **The least recently used victim.** Among nodes without a free slot still tied, the one whose
   oldest idle (nothing in flight), unpinned, loaded-or-sleeping, not stopping model was used
   longest ago wins: its eviction (A5) costs least. A node with no such victim ranks last; the
   request waits in its queue there until a slot frees. Nodes with a free slot evict nothing, so
   this step does not order them.
P5 **Name.** Finally the node name, so the same views always give the same node.

A node that is not live (lost: no heartbeat) is never chosen. Views are compared by content:
their order in the input does not matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from routerpanel.router.states import EVICTABLE, LOADED, LOADING, SLEEPING


def eligible(nodes: Sequence[str], node: str) -> bool:
    """Whether a preset naming ``nodes`` (empty: any) runs on the router of node ``node``; the
    single router of team mode or ``serve`` (``node == ""``) runs every preset."""
    return not node or not nodes or node in nodes


@dataclass(frozen=True)
class ModelView:
    """One model as a node reports it: its engine state (``states.ModelState`` values),
    whether it is stopping, whether requests wait for it in that node's queue, when it was last
    used (any clock, as long as it is the same for every node compared), and whether it has
    requests in flight (``busy``) or is pinned."""

    state: str = "unloaded"
    stopping: bool = False
    queued: bool = False
    last_used: float = 0.0
    busy: bool = False
    pinned: bool = False

    @property
    def evictable(self) -> bool:
        """Whether A5 could stop it to free a slot: idle, unpinned, loaded or sleeping."""
        return self.state in EVICTABLE and not (self.stopping or self.busy or self.pinned)


@dataclass(frozen=True)
class NodeView:
    """What the web side knows of one node: its name, whether it is live (heartbeat seen
    in time), its ``models_max`` (``<= 0``: unlimited), how many children run there (stopping
    ones included: they hold their slot, A6), its available memory in bytes (None: unknown),
    and its models by name. Treat ``models`` as read-only."""

    name: str
    live: bool
    models_max: int
    running: int
    memory_available: int | None = None
    models: Mapping[str, ModelView] = field(default_factory=dict)

    @property
    def free_slot(self) -> bool:
        return self.models_max <= 0 or self.running < self.models_max

    def victim(self) -> tuple[str, ModelView] | None:
        """The model A5 would evict here first (oldest ``last_used``, then name), or None."""
        found = [(m.last_used, name, m) for name, m in self.models.items() if m.evictable]
        if not found:
            return None
        _, name, model = min(found, key=lambda item: (item[0], item[1]))
        return name, model


@dataclass(frozen=True)
class Placement:
    """The chosen node and why, in words for the audit log and the dashboard; ``held``: P1
    chose it (the node already holds the model), so nothing new starts there for this request."""

    node: str
    reason: str
    held: bool = False


class NoEligibleNode(LookupError):
    """No eligible node is live: the request cannot be placed anywhere now."""

    def __init__(self, model: str, eligible: Sequence[str], lost: Sequence[str]) -> None:
        self.model, self.eligible, self.lost = model, tuple(eligible), tuple(lost)
        if not eligible:
            text = f"no node is known to run model {model!r}"
        else:
            text = f"no eligible node is live for model {model!r}: eligible {', '.join(eligible)}"
            unknown = [n for n in eligible if n not in lost]
            if lost:
                text += f"; lost: {', '.join(lost)}"
            if unknown:
                text += f"; never seen: {', '.join(unknown)}"
        super().__init__(text)


# P1: how firmly a node holds the model (lower is firmer); None: it does not hold it.
def _holding(model: ModelView | None) -> tuple[int, str] | None:
    if model is None:
        return None
    if model.state in (LOADED, SLEEPING) and not model.stopping:
        return 0, str(model.state)
    if model.state == LOADING and not model.stopping:
        return 1, "loading"
    if model.queued:
        return 2, "being started"
    return None


def _rank(view: NodeView) -> tuple[int, tuple[int, int], tuple[int, float, str], str]:
    """The sort key of P2-P5 (smaller wins)."""
    free = 0 if view.free_slot else 1
    memory = (0, -view.memory_available) if view.memory_available is not None else (1, 0)
    victim_key: tuple[int, float, str] = (0, 0.0, "")
    if not view.free_slot:
        victim = view.victim()
        victim_key = (0, victim[1].last_used, victim[0]) if victim else (1, 0.0, "")
    return free, memory, victim_key, view.name


def place(model: str, nodes: Sequence[str], views: Iterable[NodeView]) -> Placement:
    """Choose the node for a request for ``model``, whose preset may run on ``nodes`` (empty:
    any of ``views``); raise ``NoEligibleNode`` when none of them is live. See P1-P5 above."""
    by_name: dict[str, NodeView] = {}
    for view in views:
        if view.name in by_name:
            raise ValueError(f"node {view.name!r} is given twice")
        by_name[view.name] = view
    wanted = sorted(set(nodes)) if nodes else sorted(by_name)
    candidates = [by_name[n] for n in wanted if n in by_name and by_name[n].live]
    if not candidates:
        lost = [n for n in wanted if n in by_name]
        raise NoEligibleNode(model, wanted, lost)
    holders = []
    for view in candidates:
        held = _holding(view.models.get(model))
        if held is not None:
            holders.append((held, view.name))
    if holders:
        (_, how), name = min(holders)
        return Placement(name, f"{how} on {name}", held=True)
    ranked = sorted(candidates, key=_rank)
    return Placement(ranked[0].name, _reason(ranked[0], ranked[1] if len(ranked) > 1 else None))


def _reason(best: NodeView, runner_up: NodeView | None) -> str:
    """Say which step chose ``best``: the first one that tells it from the next best node."""
    key = _rank(best)
    other = _rank(runner_up) if runner_up is not None else None
    step = next((i for i in range(4) if other is None or key[i] != other[i]), 3)
    victim = None if best.free_slot else best.victim()
    if best.free_slot:
        text = f"free slot on {best.name}"
        if step == 1:
            text += ", most memory left"
    elif step == 1:
        text = f"most memory left on {best.name}"
    elif victim is not None:
        text = f"least recently used idle victim on {best.name} ({victim[0]})"
    else:
        text = f"no free slot and nothing idle to evict on {best.name}: waits in its queue"
    if step == 3 and runner_up is not None:
        text += " (first by name)"
    return text
