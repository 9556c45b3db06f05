"""The engine imports no framework (DESIGN §3): checked in a fresh interpreter."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import routerpanel.router

FORBIDDEN = ("django", "channels", "celery", "redis", "daphne", "channels_redis", "kombu")


def test_it_imports_every_engine_module_without_any_framework() -> None:
    modules = [
        f"routerpanel.router.{info.name}"
        for info in pkgutil.iter_modules(routerpanel.router.__path__)
    ]
    assert "routerpanel.router.ini" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    root = Path(routerpanel.router.__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"framework modules imported: {result.stdout.strip()}"
