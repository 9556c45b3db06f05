"""Django settings for the test runner's own process: the product's, with two changes.

- **A data dir per pytest worker.** Each xdist worker (and a run without workers) gets its own
  directory for the test database, the audit journal, locks and the secret key, under
  ``ROUTERPANEL_DATA_DIR`` when it is set (``make test`` sets a fresh one), else under a new
  temporary directory. Two workers never share a file.
- **A fast password hasher.** Django's default PBKDF2 costs about 0.4 s per hash on this kind of
  machine, and every fixture that creates a user pays it; MD5 is fine for throwaway test users.

Only this process uses these settings: ``manage.py`` processes that tests start (``serve``,
``runrouter``) run the product's own ``routerpanel.settings``, with its real hasher, because the
variable pytest-django set is put back below before any of them starts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# The run's directory: chosen by the first process (xdist's controller) and inherited by workers.
_RUN_DIR = os.environ.setdefault(
    "ROUTERPANEL_TEST_RUN_DIR",
    os.environ.get("ROUTERPANEL_DATA_DIR") or tempfile.mkdtemp(prefix="routerpanel-tests-"),
)
os.environ["ROUTERPANEL_DATA_DIR"] = str(
    Path(_RUN_DIR) / os.environ.get("PYTEST_XDIST_WORKER", "main")
)

from routerpanel.settings import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# pytest-django exported DJANGO_SETTINGS_MODULE=tests.settings for this process; children must
# not inherit it (they would take this module's hasher and data dir). Workers still load this
# module: pyproject.toml names it with --ds, which wins over the environment.
os.environ["DJANGO_SETTINGS_MODULE"] = "routerpanel.settings"
