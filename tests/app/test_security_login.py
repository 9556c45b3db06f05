"""Panel sign-ins are throttled, locked out, audited and unlockable (issue 13).

The probe: 30 wrong passwords for ``admin`` in 22 s met no throttle, no lockout and no audit
row. Now, after ``AXES_FAILURE_LIMIT`` failures (5 by default) for one user name or from one
address within the lockout time, sign-ins for it get the lockout page (429) until the lockout
time has passed or an admin unlocks it on the Users page; failures and lockouts are audit rows,
rate-limited like the API's 401s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.test import Client, override_settings
from django.utils import timezone

from models_app.accounts import signin
from models_app.accounts.roles import Role
from models_app.models import AuditEvent, AuditKind
from tests.support.panel import PASSWORD, client_for, make_user

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db

LIMIT = 5  # the default ROUTERPANEL_LOGIN_FAILURE_LIMIT


class ManualTimers:
    """Stands in for ``threading.Timer``: a test ends a window by calling ``fire()``."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def __call__(self, seconds: float, callback: Callable[[], None]) -> None:
        self.pending.append(callback)

    def fire(self) -> None:
        due, self.pending = self.pending, []
        for callback in due:
            callback()


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> ManualTimers:
    timers = ManualTimers()
    monkeypatch.setattr(signin, "AUDIT", signin.SignInAudit(start_timer=timers))
    return timers


@pytest.fixture
def ada(timers: ManualTimers) -> Any:
    return make_user("ada", Role.OPERATOR)


def sign_in(username: str, password: str, address: str = "10.0.0.1") -> Any:
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password})


def rows(kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=kind).order_by("id"))


class TestThrottling:
    def test_the_right_password_signs_in(self, ada: Any) -> None:
        assert sign_in("ada", PASSWORD).status_code == 302

    def test_after_the_limit_even_the_right_password_meets_the_lockout_page(self, ada: Any) -> None:
        for _ in range(LIMIT - 1):
            assert sign_in("ada", "wrong").status_code == 200  # the form, with its error
        locked = sign_in("ada", "wrong")
        assert locked.status_code == 429
        page = locked.content.decode()
        assert "Sign-in locked for now" in page
        assert f"{LIMIT} within 15 minutes" in page
        assert "ask an admin to unlock it on the Users page" in page
        assert 800 <= int(locked["Retry-After"]) <= 900
        refused = sign_in("ada", PASSWORD)
        assert refused.status_code == 429
        assert "_auth_user_id" not in refused.wsgi_request.session

    def test_thirty_wrong_passwords_are_not_thirty_tries(self, ada: Any) -> None:
        answers = [sign_in("ada", f"guess-{n}").status_code for n in range(30)]
        assert answers == [200] * (LIMIT - 1) + [429] * (30 - LIMIT + 1)

    def test_a_user_name_is_locked_whatever_address_the_guesses_come_from(self, ada: Any) -> None:
        for n in range(LIMIT):
            sign_in("ada", "wrong", address=f"10.0.1.{n}")
        assert sign_in("ada", PASSWORD, address="10.0.2.1").status_code == 429

    def test_an_address_is_locked_whatever_user_names_it_tries(self, ada: Any) -> None:
        make_user("bob", Role.VIEWER)
        for n in range(LIMIT):
            sign_in(f"user{n}", "wrong", address="10.0.3.3")
        assert sign_in("bob", PASSWORD, address="10.0.3.3").status_code == 429
        assert sign_in("bob", PASSWORD, address="10.0.3.4").status_code == 302

    def test_the_lockout_ends_when_the_lockout_time_has_passed(self, ada: Any) -> None:
        for _ in range(LIMIT):
            sign_in("ada", "wrong")
        assert sign_in("ada", PASSWORD).status_code == 429
        past = timezone.now() - timedelta(seconds=901)
        AccessAttempt.objects.update(attempt_time=past)
        assert sign_in("ada", PASSWORD).status_code == 302

    @override_settings(AXES_FAILURE_LIMIT=2, AXES_COOLOFF_TIME=timedelta(minutes=1))
    def test_the_limit_and_the_lockout_time_come_from_the_settings(self, ada: Any) -> None:
        sign_in("ada", "wrong")
        locked = sign_in("ada", "wrong")
        assert locked.status_code == 429
        assert "2 within 1 minute" in locked.content.decode()

    def test_the_django_admins_sign_in_is_throttled_too(self, ada: Any) -> None:
        for _ in range(LIMIT):
            sign_in("ada", "wrong")
        response = Client(REMOTE_ADDR="10.0.0.1").post(
            "/admin/login/", {"username": "ada", "password": PASSWORD}
        )
        assert response.status_code == 429


class TestAudit:
    def test_the_first_failure_is_a_row_at_once_and_a_flood_one_more(
        self, ada: Any, timers: ManualTimers
    ) -> None:
        sign_in("ada", "wrong")
        [first] = rows(AuditKind.LOGIN_FAILED)
        assert first.actor == "anonymous"
        assert first.reason == "1 failed panel sign-in: ada from 10.0.0.1"
        assert first.details["usernames"] == {"ada": 1}
        for _ in range(3):
            sign_in("ada", "wrong")
        assert len(rows(AuditKind.LOGIN_FAILED)) == 1  # counted, not written, within the window
        timers.fire()  # the window ends
        second = rows(AuditKind.LOGIN_FAILED)[1]
        assert second.details["count"] == 3
        assert second.reason == "3 failed panel sign-ins: ada from 10.0.0.1"
        timers.fire()  # a quiet window closes without a row
        assert len(rows(AuditKind.LOGIN_FAILED)) == 2
        assert timers.pending == []

    def test_a_lockout_and_the_attempts_it_refuses_are_locked_rows(
        self, ada: Any, timers: ManualTimers
    ) -> None:
        for _ in range(LIMIT):
            sign_in("ada", "wrong")
        [locked] = rows(AuditKind.LOGIN_LOCKED)
        assert locked.reason == "1 panel sign-in locked out: ada from 10.0.0.1"
        for _ in range(4):
            sign_in("ada", PASSWORD)
        timers.fire()
        refused = rows(AuditKind.LOGIN_LOCKED)[1]
        assert refused.details["count"] == 4
        assert refused.reason.startswith("4 panel sign-ins refused while locked out: ada")
        # the failures before the lockout: one row at once, one for the other three
        assert sum(r.details["count"] for r in rows(AuditKind.LOGIN_FAILED)) == LIMIT - 1

    def test_a_user_name_that_does_not_exist_is_not_written_down(
        self, ada: Any, timers: ManualTimers
    ) -> None:
        sign_in("my-secret-password", "wrong")
        [row] = rows(AuditKind.LOGIN_FAILED)
        assert "my-secret-password" not in str(row.reason) + str(row.details)
        assert row.details["usernames"] == {signin.UNKNOWN_USER: 1}

    @pytest.mark.django_db(transaction=True)
    def test_a_windows_row_is_written_from_its_timer_thread(self) -> None:
        audit = signin.SignInAudit(window=0.2)  # real timers, the real writer
        for _ in range(3):
            audit.note(AuditKind.LOGIN_FAILED, "ada", "10.0.0.1", "/login/")
        deadline = time.monotonic() + 10
        while len(rows(AuditKind.LOGIN_FAILED)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.details["count"] for r in rows(AuditKind.LOGIN_FAILED)] == [1, 2]


class TestUnlock:
    @pytest.fixture
    def locked(self, ada: Any) -> Iterator[None]:
        for _ in range(LIMIT):
            sign_in("ada", "wrong")
        assert sign_in("ada", PASSWORD).status_code == 429
        yield

    def test_the_users_page_lists_the_lockouts(self, locked: None) -> None:
        admin = client_for(make_user("root", Role.ADMIN))
        page = admin.get("/users/").content.decode()
        assert 'data-lockout="user:ada"' in page
        assert 'data-lockout="address:10.0.0.1"' in page
        assert "Unlock user name ada" in page

    def test_an_admin_unlocks_a_user_name_and_it_is_audited(self, locked: None) -> None:
        admin = client_for(make_user("root", Role.ADMIN))
        response = admin.post("/users/unlock/", {"kind": "user", "value": "ada"}, follow=True)
        assert "Unlocked sign-in for the user name ada." in response.content.decode()
        [row] = rows(AuditKind.LOGIN_UNLOCKED)
        assert row.actor == "user:root"
        assert row.reason == "unlocked panel sign-in for user name ada"
        assert row.details["attempts_removed"] >= 1
        assert signin.lockouts() == []
        assert sign_in("ada", PASSWORD).status_code == 302

    def test_an_admin_unlocks_an_address(self, locked: None) -> None:
        admin = client_for(make_user("root", Role.ADMIN))
        admin.post("/users/unlock/", {"kind": "address", "value": "10.0.0.1"})
        assert [lock.kind for lock in signin.lockouts()] == []
        assert rows(AuditKind.LOGIN_UNLOCKED)[0].details["kind"] == "address"

    @pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR])
    def test_only_an_admin_may_unlock(self, locked: None, role: Role) -> None:
        other = client_for(make_user("someone", role))
        response = other.post("/users/unlock/", {"kind": "user", "value": "ada"})
        assert response.status_code == 403
        assert [lock.value for lock in signin.lockouts()] == ["ada", "10.0.0.1"]
        assert rows(AuditKind.LOGIN_UNLOCKED) == []

    def test_an_unlock_needs_a_kind_and_a_value(self, locked: None) -> None:
        admin = client_for(make_user("root", Role.ADMIN))
        response = admin.post("/users/unlock/", {"kind": "everything", "value": ""}, follow=True)
        assert "Say which user name or address to unlock." in response.content.decode()
        assert len(signin.lockouts()) == 2
