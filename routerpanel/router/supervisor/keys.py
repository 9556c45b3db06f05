"""The child keys' files (issue 18): each keyed spawn's API key in a new file only this user
can read (``--api-key-file``, so the key is not on the command line ``ps`` shows), removed
once the child has exited; at start, the files a killed router left behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
from collections.abc import Collection
from pathlib import Path


class KeyFiles:
    """Write and remove key files in one folder (the data dir, or a private temporary one)."""

    def __init__(self, key_dir: Path | None) -> None:
        self._dir = key_dir

    def write(self, name: str, key: str) -> Path:
        """Write ``key`` to a new file only this user can read; return its path."""
        if self._dir is None:  # no data dir: a private temporary one, made once
            self._dir = Path(tempfile.mkdtemp(prefix="routerpanel-keys-"))
        self._dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
        path = self._dir / f"child-key-{safe}-{secrets.token_hex(6)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(key + "\n")
        return path

    def remove_stale(self, live: Collection[Path | None]) -> int:
        """Remove the key files not in ``live`` (one router per data dir); return how many."""
        if self._dir is None or not self._dir.is_dir():
            return 0
        stale = [p for p in self._dir.glob("child-key-*") if p not in live]
        for path in stale:
            remove(path)
        return len(stale)


def remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
