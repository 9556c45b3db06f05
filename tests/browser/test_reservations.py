"""Reservations in a real browser (issue 17.6): an admin books a model for a group on the week
calendar; an overlapping booking of the same model is a field error naming the first; a
booking is deleted after a confirmation page. Windows are tomorrow, so no model is pinned for
the other tests."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from tests.support.browser import PHONE, Page, PanelServer, screenshot


def book(page: Page, model: str, day: dt.date, hours: tuple[int, int], note: str = "") -> None:
    p = page[0]
    p.select_option("#id_model", model)
    p.select_option("#id_subject", label="group operator")
    p.fill("#id_starts_at", f"{day:%Y-%m-%d}T{hours[0]:02d}:00")
    p.fill("#id_ends_at", f"{day:%Y-%m-%d}T{hours[1]:02d}:00")
    p.fill("#id_note", note)
    p.click("#reservation-form button[type=submit]")


def test_a_booking_shows_on_the_week_an_overlap_is_refused_and_delete_asks_first(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    tomorrow = dt.date.today() + dt.timedelta(days=2)
    page.goto(f"{quiet.url}/reservations/")
    book((page, console), "demo-large", tomorrow, (14, 16), "workshop")
    booking = page.locator("#week li.booking", has_text="demo-large")
    assert booking.count() == 1
    text = booking.inner_text()
    assert "14:00" in text and "16:00" in text and "group operator" in text and "workshop" in text
    book((page, console), "demo-large", tomorrow, (15, 17))
    error = page.locator("#reservation-form .errorlist").inner_text()
    assert "demo-large is already booked" in error and "14:00–16:00" in error, error
    assert "for group operator" in error
    assert page.locator("#week li.booking", has_text="demo-large").count() == 1  # nothing added
    screenshot(page, "panel-reservations.png")
    page.locator("#week li.booking", has_text="demo-large").locator("a.delete").click()
    assert "demo-large" in page.inner_text("main")  # the confirmation names the booking
    page.click("main form button[type=submit]")
    page.wait_for_selector("#week")
    monday = tomorrow - dt.timedelta(days=tomorrow.weekday())  # the booking's week, maybe next
    page.goto(f"{quiet.url}/reservations/?week={monday.isoformat()}")
    page.wait_for_selector("#week")
    assert page.locator("#week li.booking", has_text="demo-large").count() == 0
    console.assert_clean("status of 400")  # the refused booking's answer


def test_the_week_fits_a_phone_in_the_dark(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page("dark", width=PHONE)
    page.goto(f"{quiet.url}/reservations/")
    page.click("#week-next")
    page.wait_for_selector("#week-this")
    assert page.locator("#week > li").count() == 7
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE
    assert page.evaluate("a11y.lowText()") == []
    console.assert_clean()
