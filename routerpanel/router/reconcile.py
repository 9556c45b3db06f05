"""A reload (A14): reconcile the scheduler's book with new presets.

``reconcile`` adds new models, forgets removed ones (their waiters get 400 ``not found``; a
running child is stopped once idle), clears ``failed`` on any reload (llama.cpp 2.21), lifts a
quarantine on an edited preset (A10), and restarts a running model whose command changed: it
drains, stops and is spawned again through a held queue entry. It emits ``PresetsReloaded``.
Pure and stateless: everything is the ``Book`` (book.py), changed through its choke point;
``scheduler.Scheduler.reload`` starts the input and runs admission after it.
"""

from __future__ import annotations

from collections.abc import Mapping

from routerpanel.router.book import Book, ModelRecord
from routerpanel.router.config import PresetSpec
from routerpanel.router.decisions import PresetsReloaded, StopReason, Trigger
from routerpanel.router.states import FAILED, QUARANTINED, RUNNING, UNLOADED


def reconcile(book: Book, new: Mapping[str, PresetSpec], now: float, actor: str) -> None:
    """Bring ``book`` to the presets ``new`` (name -> spec); see the module doc."""
    removed = [name for name, m in book.models.items() if name not in new and not m.removed]
    for name in removed:
        _remove(book, book.models[name], now, actor)
    added: list[str] = []
    changed: list[str] = []
    restarted: list[str] = []
    for name, spec in new.items():
        m = book.models.get(name)
        if m is None:
            book.models[name] = ModelRecord(spec)
            added.append(name)
            continue
        if m.removed:  # back before its old child exited: keep it
            m.removed = False
            m.drain_then = None if m.drain_then is StopReason.REMOVED else m.drain_then
        old, m.spec = m.spec, spec
        if m.state is FAILED:
            book.set_state(m, UNLOADED, "reload clears failed")  # failed -> unloaded
        if spec == old:
            continue
        changed.append(name)
        m.failures = 0
        if m.state is QUARANTINED:
            book.set_state(m, UNLOADED, "preset edited")  # quarantined -> unloaded (A10)
        if spec.command != old.command and m.state in RUNNING and not m.stopping:
            _restart(book, m, now, actor)
            restarted.append(name)
    lists = (tuple(added), tuple(removed), tuple(changed), tuple(restarted))
    book.emit(PresetsReloaded(actor, *lists))


def _remove(book: Book, m: ModelRecord, now: float, actor: str) -> None:
    name = m.spec.name
    m.removed = True
    book.cancel_entry(name, 400, "invalid_request_error", f"model '{name}' not found")
    if m.state not in RUNNING:
        del book.models[name]
    elif not m.stopping and m.in_flight > 0:
        m.drain_then = StopReason.REMOVED
    elif not m.stopping:
        book.stop(m, StopReason.REMOVED, Trigger(actor), now)  # loaded -> loaded+stopping


def _restart(book: Book, m: ModelRecord, now: float, actor: str) -> None:
    book.queue.hold(m.spec.name, now, actor)
    if m.in_flight > 0:
        m.drain_then = StopReason.RELOAD  # no new requests; stop when the last one ends
    else:
        book.stop(m, StopReason.RELOAD, Trigger(actor), now)  # loaded -> loaded+stopping
