"""The data dir's free space: warn before a full disk stops the router writing its files, and
say so plainly when it has.

Every file the router writes (its state file, the audit journal, the SQLite database) lives in
the data dir. A full disk does not stop the router (each write is caught where it happens), but
it stops those files from keeping up; ``ROUTERPANEL_DISK_WARN_MB`` (1024 by default) is the
free space under which ``/ready`` and the log say so, before that happens.
"""

from __future__ import annotations

import html
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

MB = 1 << 20


def low_space(path: Path, warn_mb: int) -> str | None:
    """Say how little space is left under ``path`` when it is under ``warn_mb``, else None."""
    try:
        free = shutil.disk_usage(path).free
    except OSError as exc:
        return f"the data dir {path} cannot be read: {exc.strerror or exc}"
    if free >= warn_mb * MB:
        return None
    return f"the data dir {path} has {free / MB:.0f} MB free (warning under {warn_mb} MB)"


# What SQLite (and PostgreSQL) say when the disk under the database refuses a write.
STORAGE_ERRORS = re.compile(
    r"disk is full|no space left|disk I/O error|readonly database|read-only file system", re.I
)
PAGE = (
    "<!doctype html><html lang=en><meta charset=utf-8><title>Storage full</title>"
    "<h1>The server cannot write its data</h1><p>{why}</p><p>Nothing was saved. Serving models "
    "goes on; try again once space is freed in the data dir (see <code>/ready</code>).</p>"
)


class StorageErrorMiddleware:
    """A page that says the disk is full (503), instead of a bare 500, when a view's write to
    the database fails for lack of space or a read-only disk (a sign-in, a saved form)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DatabaseError) or not STORAGE_ERRORS.search(str(exception)):
            return None
        why = html.escape(f"The database refused a write: {exception}.")
        return HttpResponse(PAGE.format(why=why), status=503, headers={"Retry-After": "30"})
