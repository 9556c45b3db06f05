"""The engine's side of reservations (issue 17.6): the whole set in, loads in advance out.

``Reservations.replace`` resolves each model's name or alias, hands the set to the inbox
(``SetReservations``: the scheduler pins the models and puts their owners first, R1 and R2 in
scheduler.py) and loads each model newly reserved and not running as the actor
``reservation``, through the queue like any load (A9): unload before load and models_max hold.
``Reservations`` owns those loads' tasks; the engine hands it the inbox, how to resolve a name,
whether a model runs, and ``Engine.load``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from routerpanel.router import commands
from routerpanel.router.errors import RouterError
from routerpanel.router.parts import Calls, Load

log = logging.getLogger("routerpanel.router.engine")  # the engine's, as before the split
RESERVATION_ACTOR = "reservation"  # who loads a reserved model in advance (issue 17.6)


class Reservations:
    """Replace the reservations and load the newly reserved models (see module doc)."""

    def __init__(
        self,
        *,
        inbox: Calls,
        resolve: Callable[[str], str | None],
        runs: Callable[[str], bool],
        load: Load,
    ) -> None:
        self._inbox, self._resolve, self._runs, self._load = inbox, resolve, runs, load
        self._preloads: set[asyncio.Task[None]] = set()  # the loads in advance under way

    async def replace(
        self, reservations: Mapping[str, Iterable[str]], actor: str
    ) -> dict[str, list[str]]:
        """``Engine.set_reservations``: returns ``reserved``, ``loading`` and ``unknown``."""
        reserved: dict[str, frozenset[str]] = {}
        unknown: list[str] = []
        for model, owners in reservations.items():
            name = self._resolve(model)
            if name is None:
                unknown.append(model)
                continue
            reserved[name] = reserved.get(name, frozenset()) | frozenset(owners)
        result: asyncio.Future[list[str]] = self._inbox.future()
        added = await self._inbox.call(commands.SetReservations(reserved, actor, result), result)
        loading = [name for name in added if not self._runs(name)]
        for name in loading:
            task = asyncio.create_task(self._load_reserved(name), name=f"reservation {name}")
            self._preloads.add(task)
            task.add_done_callback(self._preloads.discard)
        return {"reserved": sorted(reserved), "loading": loading, "unknown": sorted(unknown)}

    async def _load_reserved(self, name: str) -> None:
        try:
            await self._load(name, actor=RESERVATION_ACTOR)
        except RouterError as exc:  # already running, shutting down, a full queue: logged
            log.info("reserved model %s was not loaded in advance: %s", name, exc.message)
