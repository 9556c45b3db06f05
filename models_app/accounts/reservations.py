"""Reservations (issue 17.6): a model booked for a time window for a user or a group.

The schedule is ``tick()``: beat runs it every ``RESERVATIONS_TICK_SECONDS`` in team mode (the
``reservations_tick`` task), the embedded beat in process in embedded mode, and the panel once
more right after a booking is made or deleted. Each tick hands the router the whole current set
— model -> the owners (``user:<name>``; a group's active members) it is reserved for — so it is
idempotent and a restarted router is whole again at the next tick. The router pins each reserved
model, loads it in advance and serves its owners first (routerpanel/router/scheduler.py, R1-R2).

Each tick also writes the ``reservation_started`` and ``reservation_ended`` audit rows, each
exactly once: a conditional update of the reservation's ``*_audited_at`` marks it in the same
transaction as the row, so two ticks (or a tick after a restart) cannot both write it. Rows are
written only once the router has taken the set; a tick that cannot reach it writes nothing and
the next one catches up. A booking deleted while it runs ends at once (``delete``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from models_app.models import AuditEvent, AuditKind, Reservation
from models_app.routing.client import RouterClient
from routerpanel.router.errors import RouterError

log = logging.getLogger(__name__)

TICK_ACTOR = "schedule"  # who hands the router the set (as the scheduled preloads)


def active(now: datetime) -> QuerySet[Reservation]:
    """The reservations whose window is open at ``now``."""
    rows = Reservation.objects.filter(starts_at__lte=now, ends_at__gt=now)
    return rows.select_related("user", "group")


def overlapping(model: str, starts_at: datetime, ends_at: datetime) -> Reservation | None:
    """The first booking of ``model`` whose window overlaps ``starts_at``..``ends_at``."""
    rows = Reservation.objects.filter(model=model, starts_at__lt=ends_at, ends_at__gt=starts_at)
    first: Reservation | None = rows.select_related("user", "group").order_by("starts_at").first()
    return first


def owners(reservation: Reservation) -> set[str]:
    """The fair-share owners a reservation is for: its user, or its group's active members."""
    if reservation.user is not None:
        return {f"user:{reservation.user.get_username()}"}
    users = get_user_model().objects.filter(groups=reservation.group_id, is_active=True)
    return {f"user:{name}" for name in users.values_list("username", flat=True)}


def current_set(rows: Iterable[Reservation]) -> dict[str, list[str]]:
    """Model -> its owners, sorted (overlaps are refused, but two rows of one model merge)."""
    found: dict[str, set[str]] = {}
    for row in rows:
        found.setdefault(row.model, set()).update(owners(row))
    return {model: sorted(who) for model, who in sorted(found.items())}


def window_text(row: Reservation) -> str:
    """``Tue 14:00–16:00`` in the display time zone; ``Tue 22:00 – Wed 02:00`` across days."""
    start, end = timezone.localtime(row.starts_at), timezone.localtime(row.ends_at)
    if start.date() == end.date():
        return f"{start:%a %H:%M}–{end:%H:%M}"
    return f"{start:%a %-d %b %H:%M} – {end:%a %-d %b %H:%M}"


def describe(row: Reservation) -> str:
    """``qwen-72b, Tue 14:00–16:00, for group workshop``."""
    return f"{row.model}, {window_text(row)}, for {row.subject}"


def tick(now: datetime | None = None, client: RouterClient | None = None) -> dict[str, Any]:
    """Hand the router the reservations open now; audit starts and ends (see module doc)."""
    now = now or timezone.now()
    rows = list(active(now))
    reserved = current_set(rows)
    client = client or RouterClient()
    try:
        answer = async_to_sync(client.set_reservations)(reserved, actor=TICK_ACTOR)
    except RouterError as exc:
        log.warning("reservations not handed to the router: %s", exc)
        return {"reserved": reserved, "router": str(exc), "started": [], "ended": []}
    started = [row for row in rows if row.started_audited_at is None and _mark_started(row, now)]
    ended_rows = Reservation.objects.filter(
        ends_at__lte=now, started_audited_at__isnull=False, ended_audited_at__isnull=True
    ).select_related("user", "group")
    ended = [row for row in ended_rows if _mark_ended(row, now, row.created_by, "window over")]
    return {
        "reserved": reserved,
        "router": answer,
        "started": [row.pk for row in started],
        "ended": [row.pk for row in ended],
    }


def _mark_started(row: Reservation, now: datetime) -> bool:
    with transaction.atomic():
        marked = Reservation.objects.filter(pk=row.pk, started_audited_at__isnull=True)
        if not marked.update(started_audited_at=now):
            return False  # another tick wrote it
        _record(AuditKind.RESERVATION_STARTED, row, row.created_by, "started")
    return True


def _mark_ended(row: Reservation, now: datetime, actor: str, why: str) -> bool:
    with transaction.atomic():
        marked = Reservation.objects.filter(pk=row.pk, ended_audited_at__isnull=True)
        if not marked.update(ended_audited_at=now):
            return False
        _record(AuditKind.RESERVATION_ENDED, row, actor, why)
    return True


def _record(kind: str, row: Reservation, actor: str, why: str) -> AuditEvent:
    booked = f"booked by {row.created_by}"
    return AuditEvent.objects.record(
        kind,
        model=row.model[:200],
        actor=actor,
        reason=f"{describe(row)} ({why}; {booked})"[:500],
        details={
            "reservation": row.pk,
            "model": row.model,
            "starts_at": row.starts_at.isoformat(),
            "ends_at": row.ends_at.isoformat(),
            "for": row.subject,
            "booked_by": row.created_by,
            "note": row.note,
            "why": why,
        },
    )


def delete(row: Reservation, actor: str) -> None:
    """Delete a booking; one that has started and not ended is audited as ended now."""
    with transaction.atomic():
        if row.started_audited_at is not None and row.ended_audited_at is None:
            _mark_ended(row, timezone.now(), actor, f"deleted by {actor}")
        row.delete()


def dashboard_notes(now: datetime | None = None) -> dict[str, str]:
    """Model -> ``reserved for group workshop until 16:00``, for the dashboard's cards."""
    notes = {}
    for row in active(now or timezone.now()):
        until = timezone.localtime(row.ends_at)
        notes[row.model] = f"reserved for {row.subject} until {until:%H:%M}"
    return notes
