"""Test tiers: each top-level folder under tests/ is a tier and a pytest marker.

Run one tier with ``pytest -m unit`` (or ``pytest tests/unit``). Outside CI a tier whose
dependency is missing is skipped with the reason printed; with ``CI=true`` it fails instead,
so a CI run can never go green by skipping what it was meant to test (DESIGN §9).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Shared helpers (tests/support) assert too: rewrite them like test modules, for clear failures.
pytest.register_assert_rewrite("tests.support", "tests.serving")

TESTS_DIR = Path(__file__).resolve().parent
TIERS = ("unit", "app", "process", "services", "browser", "llama", "chaos")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(str(item.path)).resolve().relative_to(TESTS_DIR).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
