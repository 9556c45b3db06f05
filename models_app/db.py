"""Database work on threads of its own (``sync_to_async(..., thread_sensitive=False)``, timers,
the audit writer): Django closes stale connections only around its own requests."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import connections

P = ParamSpec("P")
R = TypeVar("R")


def drop_stale_connections() -> None:
    """Close each of this thread's connections the database dropped or that outlived its age.

    A connection inside a transaction (a caller's atomic block, or a test's) is left alone:
    closing it there would end the caller's transaction, not a stale connection.
    """
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def own_connection(func: Callable[P, R]) -> Callable[P, R]:
    """Run ``func`` on a fresh-enough connection and leave none stale behind it."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        drop_stale_connections()
        try:
            return func(*args, **kwargs)
        finally:
            drop_stale_connections()

    return wrapper
