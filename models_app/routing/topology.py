"""The names of several hosts' routers (issue 18), in one leaf: a node name's rule, the channel a
node's router listens on, and the Redis keys of its heartbeat, its lock and the set of nodes.
Everything that speaks of nodes (nodes.py: the directory; liveness.py: the beat; locks.py;
routing/: where a call goes) takes them from here, and this imports none of them. The events
group is named here too: the router publishes to it, dashboards and event streams listen.
"""

from __future__ import annotations

from django.conf import settings

from routerpanel.router.config import node_names_problem

UNNAMED_CHANNEL = "router"
EVENTS_GROUP = "router.events"


def check_name(node: str) -> str:
    """Return ``node`` if it is a valid node name ("" = the unnamed router); else ValueError."""
    if not node:
        return node
    problem = node_names_problem([node])
    if problem is None and len(node) > 64:
        problem = f"node name {node!r} is longer than 64 characters"
    if problem is not None:
        raise ValueError(problem)
    return node


def channel(node: str = "") -> str:
    """The channel a node's router listens on."""
    return f"{UNNAMED_CHANNEL}.{check_name(node)}" if node else UNNAMED_CHANNEL


def _key(node: str, what: str) -> str:
    prefix = settings.ROUTERPANEL_REDIS_PREFIX
    return f"{prefix}:node:{check_name(node)}:{what}" if node else f"{prefix}:router:{what}"


def heartbeat_key(node: str = "") -> str:
    return _key(node, "heartbeat")


def lock_key(node: str = "") -> str:
    return _key(node, "lock")


def members_key() -> str:
    """The hash of every named node that ever beat here (until forgotten): name -> the wall
    clock of its last beat, which outlives the beat's own key."""
    return f"{settings.ROUTERPANEL_REDIS_PREFIX}:nodes"
