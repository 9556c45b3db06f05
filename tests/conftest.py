"""Test tiers: each top-level folder under tests/ is a tier and a pytest marker.

Run one tier with ``pytest -m unit`` (or ``pytest tests/unit``). Outside CI a tier whose
dependency is missing is skipped with the reason printed; with ``CI=true`` it fails instead,
so a CI run can never go green by skipping what it was meant to test (docs: contributing).

Every test gets its tier's timeout (``TIMEOUTS``): a stuck test fails with every thread's stack
in seconds for the unit tier, not after the ten minutes a slow tier may need in all. A test that
needs longer says so with its own ``@pytest.mark.timeout``.

Hypothesis runs under one seed per run, printed in the header; ``--hypothesis-seed=N`` (or
``ROUTERPANEL_HYPOTHESIS_SEED=N``) runs the same examples again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Shared helpers (tests/support) assert too: rewrite them like test modules, for clear failures.
pytest.register_assert_rewrite("tests.support")

# Fixtures more than one tier asks for by name (pg_database, redis_url).
pytest_plugins = ["tests.support.databases"]

TESTS_DIR = Path(__file__).resolve().parent
TIERS = ("unit", "app", "process", "services", "browser", "llama", "chaos")
# Seconds per test, about five times the slowest test of the tier on 2 busy cores.
TIMEOUTS = {
    "unit": 30,
    "app": 60,
    "process": 180,
    "services": 240,
    "browser": 180,
    "llama": 300,
    "chaos": 300,
}


def pytest_configure(config: pytest.Config) -> None:
    from tests.support.seed import run_seed  # after register_assert_rewrite

    seed = run_seed(config.getoption("hypothesis_seed", None))
    from hypothesis import core

    core.global_force_seed = seed  # what --hypothesis-seed does; workers get it from the variable


def pytest_report_header(config: pytest.Config) -> str:
    from tests.support.seed import run_seed

    seed = run_seed()
    return f"hypothesis seed: {seed} (run the same examples again: --hypothesis-seed={seed})"


# tryfirst: before xdist's own hook reads the xdist_group marks (make test: --dist loadgroup).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(str(item.path)).resolve().relative_to(TESTS_DIR).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TIMEOUTS[tier]))
        if tier == "browser":
            # One worker runs the whole tier in a row: one Playwright session and one panel
            # server for it all, and its event loop never meets an asyncio test's.
            item.add_marker(pytest.mark.xdist_group("browser"))
