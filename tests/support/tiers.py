"""Skip-or-fail for tier dependencies (DESIGN §9)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str) -> NoReturn:
    """Skip the test because ``reason`` is missing, or fail when running under CI=true."""
    if in_ci():
        pytest.fail(f"CI=true and a tier dependency is missing: {reason}", pytrace=False)
    pytest.skip(reason)
