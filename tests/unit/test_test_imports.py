"""Test modules share code only through tests/support (the suite's own rule).

A test module or a conftest imports helpers from ``tests.support`` (and Django's settings from
``tests.settings``) and asks for fixtures by name; it never imports another test module or a
conftest. Importing one runs it a second time under another name: its fixtures, hooks and
module-level state exist twice, and a change to one test file breaks another that merely
borrowed a helper from it. A ``pytest_plugins`` entry is an import too.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ALLOWED = ("tests.support", "tests.settings")


def imported(node: ast.AST, package: tuple[str, ...]) -> list[str]:
    """The modules (or module attributes) an import statement or a ``pytest_plugins``
    assignment names, relative imports resolved against ``package``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            if node.level > len(package):
                return []
            base = ".".join(package[: len(package) - node.level + 1])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        return [f"{base}.{alias.name}" for alias in node.names]
    if isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == "pytest_plugins" for target in node.targets
    ):
        values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
        return [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def why_not(name: str) -> str | None:
    """Why importing ``name`` breaks the rule, or None when it does not."""
    parts = name.split(".")
    if parts[0] != "tests" or len(parts) == 1:
        return None
    if any(name == allowed or name.startswith(f"{allowed}.") for allowed in ALLOWED):
        return None
    if "conftest" in parts:
        return "a conftest (ask for its fixtures by name; its helpers belong in tests/support)"
    if any(part.startswith("test_") for part in parts):
        return "a test module (move what it shares to tests/support)"
    return "a module outside tests/support"


def bad_imports(source: str, package: tuple[str, ...] = ("tests",)) -> list[tuple[int, str]]:
    """(line, message) for every import in ``source`` that breaks the rule."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for name in imported(node, package):
            reason = why_not(name)
            if reason is not None:
                found.append((node.lineno, f"imports {name}: {reason}"))
    return sorted(found)


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(TESTS.parent)
        package = relative.parent.parts
        for line, message in bad_imports(path.read_text(), package):
            offenders.append(f"{relative}:{line}: {message}")
    assert offenders == [], "\n".join(["", *offenders])


def test_the_check_sees_every_spelling_and_accepts_tests_support() -> None:
    source = (
        "from tests.app.conftest import AsgiClient\n"
        "import tests.browser.test_polish\n"
        "from tests.llama import ggufgen\n"
        "from tests import app\n"
        "def f():\n"
        "    from tests.chaos.test_team_faults import Team\n"
        "from .conftest import REPO\n"
        "from . import test_panel\n"
        "pytest_plugins = ('tests.support.panel', 'tests.services.conftest')\n"
        "from tests.support.asgi import AsgiClient\n"
        "from tests.support import browser\n"
        "from tests import support, settings\n"
        "import tests.settings\n"
        "import testsuite.conftest\n"
    )
    found = bad_imports(source, ("tests", "app"))
    assert [line for line, _ in found] == [1, 2, 3, 4, 6, 7, 8, 9]
    messages = dict(found)
    assert messages[1] == (
        "imports tests.app.conftest.AsgiClient: a conftest (ask for its fixtures by name;"
        " its helpers belong in tests/support)"
    )
    assert "tests.browser.test_polish: a test module" in messages[2]
    assert "tests.llama.ggufgen: a module outside tests/support" in messages[3]
    assert "tests.app.conftest.REPO: a conftest" in messages[7]
    assert "tests.app.test_panel: a test module" in messages[8]
    assert "tests.services.conftest: a conftest" in messages[9]
