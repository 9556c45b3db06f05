"""What one dashboard shows of the router's snapshot: bounded, whatever the number of presets.

The engine's snapshot lists every model. A dashboard shows every model that runs (loading,
loaded, sleeping or stopping: at most ``models_max`` per node), the models of the first
``QUEUE_ENTRIES`` queue entries, and one page of the others — those whose name or alias holds
the search text, the ones that need attention first (failed, quarantined, crash-looping, cannot
start), then pinned ones, then by name. Counts say what is left out. The page (``?q=``,
``?page=``) is the same for the server-rendered HTML and the WebSocket's snapshots, so a snapshot
stays far below the socket's frame limit (Daphne's is 1 MiB) with ten thousand presets; events
still come for every model, and one that starts running gets its card from them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PER_PAGE = 48  # idle models on a page
QUEUE_ENTRIES = 100  # queue entries sent (each with its first requests); the rest counted
BUDGET = 256 * 1024  # bytes a snapshot may take; past it the page is cut (it never is at 48)
RUNNING = frozenset({"loading", "loaded", "sleeping"})
TROUBLE = frozenset({"failed", "quarantined"})


@dataclass(frozen=True)
class View:
    """Which page of the idle models a dashboard shows."""

    q: str = ""
    page: int = 1
    per_page: int = PER_PAGE
    model: str = ""  # one model always shown (a log page's)

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> View:
        """From a query string's parameters (the page's URL, or the socket's)."""
        q = str(params.get("q") or "").strip()[:200]
        try:
            page = max(1, int(str(params.get("page") or 1)))
        except ValueError:
            page = 1
        return cls(q, page, model=str(params.get("model") or "")[:200])

    def query(self, page: int | None = None) -> str:
        """The query string of this view (another page of it with ``page``)."""
        from urllib.parse import urlencode

        params = {"q": self.q} if self.q else {}
        if (page or self.page) > 1:
            params["page"] = str(page or self.page)
        return urlencode(params)


def running(model: Mapping[str, Any]) -> bool:
    return model.get("state") in RUNNING or bool(model.get("stopping"))


def matches(model: Mapping[str, Any], q: str) -> bool:
    if not q:
        return True
    needle = q.casefold()
    names = (model.get("name") or "", *(model.get("aliases") or ()))
    return any(needle in str(name).casefold() for name in names)


def _rank(model: Mapping[str, Any]) -> tuple[int, str]:
    trouble = (model.get("state") in TROUBLE or bool(model.get("cannot_start"))
               or bool(model.get("backoff")))  # fmt: skip
    return (0 if trouble else 1 if model.get("pinned") else 2, str(model.get("name")))


def select(snap: Mapping[str, Any], view: View) -> dict[str, Any]:
    """The snapshot as this view shows it: ``models`` and ``queue`` bounded, plus ``counts``
    (every model, running, queued, matching) and ``view`` (its page, pages, search)."""
    models = list(snap.get("models") or ())
    queue = list(snap.get("queue") or ())
    shown_queue = queue[:QUEUE_ENTRIES]
    queued = {entry.get("model") for entry in shown_queue}
    always = [m for m in models
              if running(m) or m.get("name") in queued or m.get("name") == view.model]  # fmt: skip
    kept = {m["name"] for m in always}
    rest = sorted((m for m in models if m["name"] not in kept and matches(m, view.q)), key=_rank)
    per_page = view.per_page
    while True:
        pages = max(1, math.ceil(len(rest) / per_page))
        page = min(view.page, pages)
        shown = rest[(page - 1) * per_page : page * per_page]
        out = dict(snap) | {
            "models": always + shown,
            "queue": shown_queue,
            "counts": {
                "models": len(models),
                "running": sum(1 for m in models if running(m)),
                "queue_entries": len(queue),
                "waiters": sum(int(e.get("waiters") or 0) for e in queue),
                "matching": len(rest),
                "shown": len(shown),
            },
            "view": {"q": view.q, "page": page, "pages": pages, "per_page": per_page},
        }
        if per_page <= 1 or len(json.dumps(out, default=str)) <= BUDGET:
            return out
        per_page //= 2  # very large rows (long argv, many aliases): fewer of them


def shown_names(selected: Mapping[str, Any]) -> list[str]:
    return [m["name"] for m in selected.get("models") or ()]
