"""The reservations page (issue 17.6): a week calendar of bookings, in the display time zone.

Every role sees it; admins book (a form: model, start, end, user or group, note) and delete (a
confirmation page, then POST). A booking or a deletion runs the schedule once at commit
(``reservations.tick``), so a window that is already open takes effect at once rather than at
the next beat.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from models_app.accounts import reservations
from models_app.accounts.roles import Role, require, role_of
from models_app.audit import records as audit
from models_app.models import Preset, Reservation
from models_app.panel.forms import ReservationForm
from models_app.panel.views import common
from models_app.routing import transport


@require_GET
@require(Role.VIEWER)
def reservation_page(request: HttpRequest) -> HttpResponse:
    form = ReservationForm() if role_of(request.user) >= Role.ADMIN else None
    return _page(request, form, _week_start(request.GET.get("week")))


@require_POST
@require(Role.ADMIN)
def reservation_create(request: HttpRequest) -> HttpResponse:
    """Book, or show the page again with the form's errors (status 400)."""
    form = ReservationForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        with transaction.atomic():
            # one booking of a model at a time: the preset row is the lock (PostgreSQL)
            list(Preset.objects.select_for_update().filter(name=data["model"]))
            taken = reservations.overlapping(data["model"], data["starts_at"], data["ends_at"])
            if taken is None:
                row = Reservation.objects.create(
                    model=data["model"], starts_at=data["starts_at"], ends_at=data["ends_at"],
                    note=data["note"], created_by=audit.actor_of(request.user), **form.target(),
                )  # fmt: skip
                _tick_on_commit()
        if taken is None:
            messages.success(request, f"Booked {reservations.describe(row)}.")
            week = _week_start(None, timezone.localtime(row.starts_at).date())
            return redirect(f"{reverse('panel:reservations')}?week={week:%Y-%m-%d}")
        text = f"{data['model']} is already booked {reservations.window_text(taken)} "
        form.add_error("starts_at", text + f"for {taken.subject}.")
    start = form.asked_start  # the week shown again is the window's, with what it collides with
    week = _week_start(None, timezone.localtime(start).date() if start else None)
    return _page(request, form, week, status=400)


@require_http_methods(["GET", "POST"])
@require(Role.ADMIN)
def reservation_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """GET asks to confirm (works without JavaScript); POST deletes."""
    row = Reservation.objects.select_related("user", "group").filter(pk=pk).first()
    if row is None:  # deleted by someone else since this page was opened: say so, not 404
        messages.info(request, "That booking was already deleted by someone else.")
        return redirect("panel:reservations")
    if request.method == "GET":
        context = {"row": row, "text": reservations.describe(row)}
        return render(request, "panel/reservation_delete.html", context)
    text = reservations.describe(row)
    reservations.delete(row, audit.actor_of(request.user))
    _tick_on_commit()
    messages.success(request, f"Deleted the booking {text}.")
    return redirect("panel:reservations")


def _tick_on_commit() -> None:
    """Run the schedule once the change commits, when a router is in reach: in process
    (embedded ``serve``) or through the worker (team mode). Otherwise the beat does it."""
    if transport.installed() is None and not settings.REDIS_URL:
        return
    from models_app.tasks import reservations_tick

    reservations_tick.delay_on_commit()


def _week_start(text: str | None, day: date | None = None) -> date:
    """The Monday of the week of ``text`` (YYYY-MM-DD) or ``day``, else of today."""
    if day is None and text:
        try:
            day = date.fromisoformat(text)
        except ValueError:
            day = None
    day = day or timezone.localdate()
    return day - timedelta(days=day.weekday())


def _page(
    request: HttpRequest, form: ReservationForm | None, monday: date, status: int = 200
) -> HttpResponse:
    zone = timezone.get_current_timezone()
    start = datetime.combine(monday, time.min, tzinfo=zone)
    end = start + timedelta(days=7)
    rows = Reservation.objects.filter(starts_at__lt=end, ends_at__gt=start)
    rows = list(rows.select_related("user", "group").order_by("starts_at", "model"))
    today, now = timezone.localdate(), timezone.now()
    days = []
    for offset in range(7):
        day = monday + timedelta(days=offset)
        day_start = datetime.combine(day, time.min, tzinfo=zone)
        day_end = day_start + timedelta(days=1)
        items = [_item(row, day_start, day_end, now) for row in rows
                 if row.starts_at < day_end and row.ends_at > day_start]  # fmt: skip
        days.append({"date": day, "today": day == today, "items": items})
    context: dict[str, Any] = {
        "days": days,
        "monday": monday,
        "sunday": monday + timedelta(days=6),
        "previous": monday - timedelta(days=7),
        "next": monday + timedelta(days=7),
        "this_week": _week_start(None),
        "zone": timezone.localtime(now).tzname(),
        "form": form,
        "can_book": role_of(request.user) >= Role.ADMIN,
        "error_links": common.error_links(form, whole=("reservation-form", "Booking"))
        if form is not None and form.is_bound
        else [],
    }
    return render(request, "panel/reservations.html", context, status=status)


def _item(
    row: Reservation, day_start: datetime, day_end: datetime, now: datetime
) -> dict[str, Any]:
    """One booking as shown on one day: the hours of it that fall on that day."""
    start = timezone.localtime(max(row.starts_at, day_start))
    end = timezone.localtime(min(row.ends_at, day_end))
    until = "24:00" if row.ends_at >= day_end else f"{end:%H:%M}"
    return {
        "row": row,
        "hours": f"{start:%H:%M}–{until}",
        "active": row.starts_at <= now < row.ends_at,
        "over": row.ends_at <= now,
    }
