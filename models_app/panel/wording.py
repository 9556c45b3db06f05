"""Small pieces of the words the panel and the API answer with, shared by the layers that say them
(a leaf: it imports nothing of the project)."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """``1 request``, ``2,000 requests``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")
