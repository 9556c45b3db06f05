"""Reservations (issue 17.6) on the panel and in the schedule: the week calendar, the booking
form's refusals (overlap, end before start, a past window, an unknown model), roles, and the
tick that hands the router the open bookings and audits each start and end exactly once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from models_app import tasks
from models_app.accounts import reservations
from models_app.models import AuditEvent, AuditKind, Preset, Reservation
from models_app.routing.layer import router_gone
from routerpanel.router.errors import RouterError

pytest_plugins = ("tests.support.panel",)
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("presets")]


class RouterStub:
    """Records each set of reservations handed over; raises ``error`` when set."""

    def __init__(self, error: RouterError | None = None) -> None:
        self.sets: list[dict[str, list[str]]] = []
        self.error = error

    async def set_reservations(
        self, reservations: dict[str, list[str]], *, actor: str
    ) -> dict[str, list[str]]:
        if self.error is not None:
            raise self.error
        self.sets.append(reservations)
        return {"reserved": sorted(reservations), "loading": [], "unknown": []}


def local(text: str) -> datetime:
    """A wall time in the display time zone (the panel's)."""
    return timezone.make_aware(datetime.fromisoformat(text))


def form(
    model: str, start: datetime, end: datetime, subject: str, note: str = ""
) -> dict[str, str]:
    fmt = "%Y-%m-%dT%H:%M"
    start, end = timezone.localtime(start), timezone.localtime(end)
    return {
        "model": model, "starts_at": start.strftime(fmt), "ends_at": end.strftime(fmt),
        "subject": subject, "note": note,
    }  # fmt: skip


@pytest.fixture
def workshop(viewer: Any) -> Group:
    group = Group.objects.create(name="workshop")
    viewer.groups.add(group)
    get_user_model().objects.create_user("gone", is_active=False).groups.add(group)
    return group


@pytest.fixture
def presets() -> None:
    Preset.objects.create(name="qwen-72b")
    Preset.objects.create(name="small")


def book(model: str, start: datetime, end: datetime, **who: Any) -> Reservation:
    return Reservation.objects.create(
        model=model, starts_at=start, ends_at=end, created_by="user:ada", **who
    )


class TestBooking:
    def tomorrow(self, hour: int) -> datetime:
        day = timezone.localdate() + timedelta(days=1)
        return timezone.make_aware(datetime(day.year, day.month, day.day, hour))

    @staticmethod
    def monday_of(moment: datetime) -> Any:
        day = timezone.localtime(moment).date()
        return day - timedelta(days=day.weekday())

    def test_a_refused_overlap_next_week_shows_next_weeks_calendar(
        self, admin_client: Any, workshop: Group, viewer: Any
    ) -> None:
        """The page shown again with the error is the week of the window asked for, with the
        booking it collides with, whatever today is (before, it was this week's)."""
        start = self.tomorrow(14) + timedelta(days=7)
        book("qwen-72b", start, start + timedelta(hours=2), group=workshop)
        data = form("qwen-72b", start + timedelta(hours=1), start + timedelta(hours=3),
                    f"user:{viewer.pk}")  # fmt: skip
        refused = admin_client.post("/reservations/new/", data)
        assert refused.status_code == 400
        assert refused.context["monday"] == self.monday_of(start)
        assert refused.context["monday"] != self.monday_of(timezone.now())
        assert "for group workshop" in refused.content.decode()

    def test_an_admin_books_a_model_for_a_group_and_is_sent_to_its_week(
        self, admin_client: Any, workshop: Group
    ) -> None:
        start, end = self.tomorrow(14), self.tomorrow(16)
        data = form("qwen-72b", start, end, f"group:{workshop.pk}", "LLM workshop")
        done = admin_client.post("/reservations/new/", data)
        assert done.status_code == 302
        monday = timezone.localdate(start) - timedelta(days=timezone.localdate(start).weekday())
        assert done["Location"] == f"/reservations/?week={monday:%Y-%m-%d}"
        row = Reservation.objects.get()
        assert (row.model, row.group, row.user, row.note) == (
            "qwen-72b",
            workshop,
            None,
            "LLM workshop",
        )
        assert (row.starts_at, row.ends_at, row.created_by) == (start, end, "user:ada")
        page = admin_client.get(done["Location"]).content.decode()
        assert (
            "Booked qwen-72b, " in page and "14:00–16:00" in page and "for group workshop" in page
        )

    def test_an_overlapping_booking_of_the_same_model_is_refused_naming_the_booking(
        self, admin_client: Any, workshop: Group, viewer: Any
    ) -> None:
        book("qwen-72b", self.tomorrow(14), self.tomorrow(16), group=workshop)
        data = form("qwen-72b", self.tomorrow(15), self.tomorrow(17), f"user:{viewer.pk}")
        refused = admin_client.post("/reservations/new/", data)
        assert refused.status_code == 400
        day = f"{self.tomorrow(14):%a}"
        text = f"qwen-72b is already booked {day} 14:00–16:00 for group workshop."
        assert refused.context["form"].errors["starts_at"] == [text]
        assert text in refused.content.decode()
        assert Reservation.objects.count() == 1
        assert refused.context["monday"] == self.monday_of(self.tomorrow(14))  # the booking's week
        # touching windows do not overlap, and another model is free
        ok = form("qwen-72b", self.tomorrow(16), self.tomorrow(17), f"user:{viewer.pk}")
        assert admin_client.post("/reservations/new/", ok).status_code == 302
        other = form("small", self.tomorrow(15), self.tomorrow(17), f"user:{viewer.pk}")
        assert admin_client.post("/reservations/new/", other).status_code == 302
        assert Reservation.objects.count() == 3

    @pytest.mark.parametrize(
        ("change", "field", "text"),
        [
            ({"ends_at": "start"}, "ends_at", "The window must end after it starts."),
            ({"past": True}, "ends_at", "This window is already over: book a time to come."),
            ({"model": "nope"}, "model", "Unknown model nope: it is not a preset."),
            ({"starts_at": "tuesday"}, "starts_at", "Enter a valid date/time."),
            ({"subject": ""}, "subject", "This field is required."),
        ],
    )
    def test_bad_windows_and_unknown_models_are_field_errors(
        self, admin_client: Any, viewer: Any, change: dict[str, Any], field: str, text: str
    ) -> None:
        start, end = self.tomorrow(14), self.tomorrow(16)
        if change.pop("past", False):
            start, end = start - timedelta(days=3), end - timedelta(days=3)
        data = form("qwen-72b", start, end, f"user:{viewer.pk}")
        if change.get("ends_at") == "start":
            change["ends_at"] = data["starts_at"]
        refused = admin_client.post("/reservations/new/", data | change)
        assert refused.status_code == 400
        assert refused.context["form"].errors[field] == [text]
        assert not Reservation.objects.exists()

    def test_a_window_that_already_started_may_be_booked(
        self, admin_client: Any, viewer: Any
    ) -> None:
        now = timezone.now()
        data = form(
            "small", now - timedelta(hours=1), now + timedelta(hours=1), f"user:{viewer.pk}"
        )
        assert admin_client.post("/reservations/new/", data).status_code == 302

    def test_roles_everyone_sees_only_admins_book_and_delete(
        self, viewer_client: Any, operator_client: Any, admin_client: Any, viewer: Any
    ) -> None:
        row = book("small", self.tomorrow(9), self.tomorrow(10), user=viewer)
        week = f"/reservations/?week={timezone.localdate(row.starts_at):%Y-%m-%d}"
        for client in (viewer_client, operator_client):
            page = client.get(week)
            assert page.status_code == 200 and "for user vera" in page.content.decode()
            assert 'id="reservation-form"' not in page.content.decode()
            assert "/delete/" not in page.content.decode()
            data = form("small", self.tomorrow(11), self.tomorrow(12), f"user:{viewer.pk}")
            assert client.post("/reservations/new/", data).status_code == 403
            assert client.post(f"/reservations/{row.pk}/delete/").status_code == 403
        assert Reservation.objects.count() == 1
        page = admin_client.get(week).content.decode()
        assert 'id="reservation-form"' in page and f"/reservations/{row.pk}/delete/" in page
        confirm = admin_client.get(f"/reservations/{row.pk}/delete/")
        assert confirm.status_code == 200 and "It has not started" in confirm.content.decode()
        assert Reservation.objects.count() == 1  # GET only asks
        assert admin_client.post(f"/reservations/{row.pk}/delete/").status_code == 302
        assert not Reservation.objects.exists()

    def test_the_form_needs_its_csrf_token(self, admin: Any, viewer: Any) -> None:
        from tests.support.panel import client_for

        client = client_for(admin, csrf=True)
        data = form("small", self.tomorrow(11), self.tomorrow(12), f"user:{viewer.pk}")
        assert client.post("/reservations/new/", data).status_code == 403
        assert not Reservation.objects.exists()


class TestCalendar:
    def test_the_week_has_seven_days_today_marked_and_links_to_the_weeks_around(
        self, viewer_client: Any, viewer: Any
    ) -> None:
        page = viewer_client.get("/reservations/").content.decode()
        today = timezone.localdate()
        monday = today - timedelta(days=today.weekday())
        assert "<h1>Reservations" in page
        assert page.count('class="day card') == 7
        assert page.count('aria-current="date"') == 1
        assert f'<time datetime="{today:%Y-%m-%d}">' in page.split('aria-current="date"')[1][:200]
        assert f"?week={monday - timedelta(days=7):%Y-%m-%d}" in page
        assert f"?week={monday + timedelta(days=7):%Y-%m-%d}" in page
        assert 'href="/reservations/" aria-current="page">Reservations</a>' in page  # the nav

    def test_a_booking_across_midnight_shows_on_both_days_in_the_display_time_zone(
        self, viewer_client: Any, viewer: Any, settings: Any
    ) -> None:
        settings.TIME_ZONE = "Europe/Berlin"  # UTC+1 in December
        book(
            "small",
            datetime(2030, 12, 3, 21, 0, tzinfo=UTC),
            datetime(2030, 12, 4, 2, 0, tzinfo=UTC),
            user=viewer,
        )
        page = viewer_client.get("/reservations/?week=2030-12-04").content.decode()  # a Wednesday
        assert "week of Mon 2 Dec 2030" in page and "(CET)" in page
        assert "22:00–24:00" in page and "00:00–03:00" in page
        assert 'aria-current="date"' not in page  # not this week
        other = viewer_client.get("/reservations/?week=2030-12-09").content.decode()
        assert "22:00–24:00" not in other and "No bookings." in other

    def test_the_dashboard_card_says_for_whom_and_until_when(
        self, viewer_client: Any, workshop: Group, panel_router: Any
    ) -> None:
        from tests.support.panel import model_row

        panel_router.models = [model_row("qwen-72b", "loaded"), model_row("small", "loaded")]
        now = timezone.now()
        end = now + timedelta(hours=2)
        book("qwen-72b", now - timedelta(minutes=5), end, group=workshop)
        page = viewer_client.get("/").content.decode()
        assert f"reserved for group workshop until {timezone.localtime(end):%H:%M}" in page
        assert page.count("reserved for ") == 1  # small is not reserved


class TestTick:
    def test_it_hands_over_the_open_bookings_with_the_groups_active_members(
        self, workshop: Group, admin: Any
    ) -> None:
        now = timezone.now()
        book("qwen-72b", now - timedelta(minutes=1), now + timedelta(hours=1), group=workshop)
        book("small", now - timedelta(minutes=1), now + timedelta(hours=1), user=admin)
        book("small", now + timedelta(hours=2), now + timedelta(hours=3), user=admin)  # later
        router = RouterStub()
        reservations.tick(now, router)  # type: ignore[arg-type]
        assert router.sets == [{"qwen-72b": ["user:vera"], "small": ["user:ada"]}]

    def test_start_and_end_are_audited_once_across_ticks(self, workshop: Group) -> None:
        start = timezone.now().replace(microsecond=0)
        row = book("qwen-72b", start, start + timedelta(minutes=2), group=workshop, note="demo")
        router = RouterStub()
        assert reservations.tick(start - timedelta(seconds=30), router)["started"] == []  # type: ignore[arg-type]
        for seconds in (0, 30, 60):  # three ticks in the window: one start row
            reservations.tick(start + timedelta(seconds=seconds), router)  # type: ignore[arg-type]
        for seconds in (120, 150):  # two after it: one end row
            reservations.tick(start + timedelta(seconds=seconds), router)  # type: ignore[arg-type]
        assert router.sets[1:4] == [{"qwen-72b": ["user:vera"]}] * 3
        assert router.sets[4:] == [{}, {}]
        started = AuditEvent.objects.filter(kind=AuditKind.RESERVATION_STARTED)
        ended = AuditEvent.objects.filter(kind=AuditKind.RESERVATION_ENDED)
        assert (started.count(), ended.count()) == (1, 1)
        first = started.get()
        assert (first.model, first.actor) == ("qwen-72b", "user:ada")
        assert first.reason.startswith("qwen-72b, ") and "for group workshop" in first.reason
        assert "booked by user:ada" in first.reason
        assert first.details["for"] == "group workshop" and first.details["note"] == "demo"
        assert first.get_kind_display() == "reservation started"
        assert ended.get().details["why"] == "window over"
        row.refresh_from_db()
        assert row.started_audited_at is not None and row.ended_audited_at is not None

    def test_a_router_out_of_reach_gets_no_rows_written_the_next_tick_catches_up(
        self, viewer: Any
    ) -> None:
        now = timezone.now()
        book("small", now - timedelta(minutes=1), now + timedelta(hours=1), user=viewer)
        out = reservations.tick(now, RouterStub(router_gone()))  # type: ignore[arg-type]
        assert out["started"] == [] and not AuditEvent.objects.exists()
        assert len(reservations.tick(now, RouterStub())["started"]) == 1  # type: ignore[arg-type]

    def test_deleting_a_running_booking_ends_it_in_the_audit_log(
        self, admin_client: Any, viewer: Any
    ) -> None:
        now = timezone.now()
        row = book("small", now - timedelta(minutes=1), now + timedelta(hours=1), user=viewer)
        reservations.tick(now, RouterStub())  # type: ignore[arg-type]
        confirm = admin_client.get(f"/reservations/{row.pk}/delete/").content.decode()
        assert "It is running now" in confirm
        admin_client.post(f"/reservations/{row.pk}/delete/")
        ended = AuditEvent.objects.get(kind=AuditKind.RESERVATION_ENDED)
        assert (ended.actor, ended.details["why"]) == ("user:ada", "deleted by user:ada")

    def test_the_task_is_on_beats_schedule_and_the_embedded_beat_checks_often_enough(
        self, settings: Any
    ) -> None:
        from models_app.embedded_beat import EmbeddedBeat

        entry = settings.CELERY_BEAT_SCHEDULE["reservations"]
        assert entry["task"] == "models_app.tasks.reservations_tick"
        assert entry["task"] in {t.name for t in [tasks.reservations_tick]}
        assert entry["schedule"] == settings.RESERVATIONS_TICK_SECONDS == 30.0
        assert EmbeddedBeat().interval == 15.0
        settings.CELERY_BEAT_SCHEDULE = {
            **settings.CELERY_BEAT_SCHEDULE,
            "reservations": {**entry, "schedule": 2.0},
        }
        beat = EmbeddedBeat()
        assert beat.interval == 2.0
        start = timezone.now()
        assert "reservations" not in beat.run_due(start)  # the first check starts the clock
        beat._last_run["reservations"] = start - timedelta(seconds=3)
        ran: list[str] = []
        from unittest import mock

        with mock.patch.object(reservations, "tick", lambda: ran.append("tick") or {}):
            assert "reservations" in beat.run_due()
        assert ran == ["tick"]
