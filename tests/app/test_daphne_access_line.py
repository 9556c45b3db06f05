"""``serve`` on Daphne writes no Twisted access line per request (``quiet_access_log``).

Importing Daphne's server installs Twisted's asyncio reactor, so the check runs in a child
Python of its own: a real ``HTTPFactory`` logs one request before the hook and none after, as
seen by an observer on Twisted's global log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import django
django.setup()
from twisted.logger import globalLogPublisher
from twisted.web import http
from twisted.web.test.requesthelper import DummyChannel
from models_app.servers.daphne_server import quiet_access_log

events = []
globalLogPublisher.addObserver(events.append)
factory = http.HTTPFactory()
factory.startFactory()  # as a listening port does: the access log goes to Twisted's log
request = http.Request(DummyChannel(), False)
request.method, request.uri, request.clientproto = b"POST", b"/tokenize", b"HTTP/1.1"
request.code, request.sentLength = 200, 17
factory.log(request)
print(len(events), str(events[-1].get("log_io", "")) if events else "")
quiet_access_log(factory)
factory.log(request)
factory.log(request)
print(len(events))
"""


def test_twisted_writes_an_access_line_per_request_until_quieted(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routerpanel.settings",
        "ROUTERPANEL_DATA_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.splitlines()
    count, line = before.split(" ", 1)
    assert count == "1" and '"POST /tokenize HTTP/1.1" 200 17' in line  # Twisted's own line
    assert after == "1"  # two more requests, no more lines
