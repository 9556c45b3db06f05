"""Every task or future a test awaits has a deadline (the suite's own rule).

``await task`` on a task that never ends hangs until the tier's timeout; ``await settled(task)``
(tests/support/waits.py), ``asyncio.wait_for`` or an enclosing ``async with asyncio.timeout``
fails in seconds and says what it waited for. Awaiting a call (``await engine.acquire(...)``) is
not checked here: the called code's own deadlines are what the tests test.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def unbounded_awaits(source: str) -> list[int]:
    """Lines that await a name, attribute or item (a task, a future) outside a timeout block."""
    found: list[int] = []

    def visit(node: ast.AST, bounded: bool) -> None:
        if isinstance(node, ast.AsyncWith):
            timeout = any(
                isinstance(item.context_expr, ast.Call)
                and ast.unparse(item.context_expr.func).endswith("timeout")
                for item in node.items
            )
            for child in node.body:
                visit(child, bounded or timeout)
            return
        awaited = node.value if isinstance(node, ast.Await) else None
        if not bounded and isinstance(awaited, ast.Name | ast.Attribute | ast.Subscript):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, bounded)

    visit(ast.parse(source), False)
    return found


def test_no_test_awaits_a_task_without_a_deadline() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in unbounded_awaits(path.read_text())
    ]
    assert offenders == [], "await settled(task) instead: " + ", ".join(offenders)


def test_the_check_sees_a_bare_await_and_accepts_a_bounded_one() -> None:
    source = (
        "async def f(task):\n"
        "    await task\n"
        "    await settled(task)\n"
        "    await asyncio.wait_for(task, 5)\n"
        "    async with asyncio.timeout(5):\n"
        "        await task\n"
        "    x = (await other.future).value\n"
    )
    assert unbounded_awaits(source) == [2, 7]
