"""Quotas through a real ``manage.py serve`` with a simulated child (issue 17.4).

A user's tokens-per-day quota, set in the database while serve runs: the request that crosses
it is answered in full, a following one is refused with 429, Retry-After until midnight UTC and
a message naming the quota (read from the usage rows in the background, so within seconds);
another user's key is not held back.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.ports import free_port
from tests.support.serving import Server, manage_beside, run_manage, sim_preset

SET_UP = """
from django.contrib.auth import get_user_model
from models_app.models import ApiKey, Quota
users = get_user_model().objects
alice, bob = users.create_user("alice"), users.create_user("bob")
_, a = ApiKey.objects.issue(alice, "batch")
_, b = ApiKey.objects.issue(bob, "laptop")
Quota.objects.create(user=alice, tokens_per_day=10)
print(a)
print(b)
"""


def keys(server: Server) -> list[str]:
    out = manage_beside(server, "shell", "-c", SET_UP)
    return [line for line in out.split() if line.startswith("rp-")]


def test_a_used_up_token_quota_is_429_until_midnight_and_binds_only_its_user(
    tmp_path: Path,
) -> None:
    ini = tmp_path / "models.ini"
    ini.write_text(sim_preset("small", f"quota-{tmp_path.name}", extra="sim-tokens = 8\n"))
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        alice, bob = keys(server)
        body = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
        as_alice = server.client(headers={"authorization": f"Bearer {alice}"})
        first = as_alice.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text  # 25 prompt + 8 completion tokens: over 10
        deadline = time.monotonic() + 20
        while (answer := as_alice.post("/v1/chat/completions", json=body)).status_code == 200:
            assert time.monotonic() < deadline, "the quota was never seen as used up"
            time.sleep(0.5)
        assert answer.status_code == 429
        error = answer.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert error["message"].startswith("user alice is over its quota of 10 tokens per day")
        # Retry-After counts to the next UTC midnight. Compared on the day's circle: a run that
        # crosses midnight between the answer and this line is off by a day, not by 86,395 s.
        midnight = 86400 - time.time() % 86400
        off = (int(answer.headers["retry-after"]) - midnight) % 86400
        assert min(off, 86400 - off) <= 5, (answer.headers["retry-after"], midnight)
        as_bob = server.client(headers={"authorization": f"Bearer {bob}"})
        assert as_bob.post("/v1/chat/completions", json=body).status_code == 200
