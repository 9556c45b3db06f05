"""What the panel's views share: asking the router, role context, byte and time formatting.

Views are synchronous (Django runs them in a worker thread under Daphne); they reach the router
through ``ask_router``, which runs the router call on the server's event loop with
``async_to_sync``. A router that does not answer in ``PAGE_TIMEOUT`` seconds is reported as
unavailable: pages still render from the database, with a banner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import messages
from django.http import HttpRequest

from models_app.accounts.roles import Role, role_of
from models_app.routing.client import RouterClient
from models_app.routing.messages import Call
from routerpanel.router import catalogue, states
from routerpanel.router.errors import RouterError

log = logging.getLogger(__name__)

PAGE_TIMEOUT = 2.0  # seconds a page waits for the router's first answer
ACTION_WAIT = 3.0  # seconds a form POST waits for a load/unload/reload before answering
_background: set[asyncio.Task[Any]] = set()


@dataclass(frozen=True)
class Answer:
    """A router call's outcome: ``body`` when it answered yes, ``error`` text otherwise;
    ``pending`` when it is still running after the wait (it goes on in the background)."""

    body: dict[str, Any] | None = None
    error: str | None = None
    status: int = 200
    pending: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.pending


def client(timeout: float | None = None, node: str | None = None) -> RouterClient:
    return RouterClient(timeout=timeout or PAGE_TIMEOUT, node=node)


async def call_router(call: Call, wait: float | None = None, node: str | None = None) -> Answer:
    """Make ``call``; give up waiting after ``wait`` seconds but let the call finish.

    A load may sit in the queue for minutes (A9): the caller gets ``pending`` and the call goes
    on as a task on the server's loop, logging its failure.
    """
    task = asyncio.ensure_future(_answer(client(node=node).call(call)))
    done, _ = await asyncio.wait({task}, timeout=wait)
    if done:
        return task.result()
    _background.add(task)
    task.add_done_callback(_finished_in_background)
    return Answer(pending=True)


async def _answer(call: Coroutine[Any, Any, Mapping[str, Any]]) -> Answer:
    try:
        return Answer(body=dict(await call))
    except RouterError as exc:
        return Answer(error=exc.message or str(exc), status=exc.status)
    except Exception as exc:  # a full or missing channel layer: the router is out of reach
        log.warning("router call failed: %s", exc)
        return Answer(error="router unavailable", status=503)


def _finished_in_background(task: asyncio.Task[Answer]) -> None:
    _background.discard(task)
    if not task.cancelled() and task.result().error:
        log.info("router call failed after the page answered: %s", task.result().error)


def ask_router(call: Call, wait: float | None = None, node: str | None = None) -> Answer:
    """``call_router`` from a synchronous view; ``node``: that node's router (several hosts)."""
    return async_to_sync(call_router)(call, wait, node)


def snapshot() -> tuple[dict[str, Any] | None, str | None]:
    """Return the engine snapshot and None, or None and why it is missing."""
    answer = ask_router({"type": "router.snapshot"}, PAGE_TIMEOUT + 1)
    if answer.body is None:
        return None, answer.error or "router unavailable"
    return answer.body, None


def report(request: HttpRequest, answer: Answer, done: str, pending: str) -> None:
    """Flash the outcome of a router call made by a form POST."""
    if answer.pending:
        messages.info(request, pending)
    elif answer.error:
        messages.error(request, f"The router said no: {answer.error}")
    else:
        messages.success(request, done)


def panel(request: HttpRequest) -> dict[str, Any]:
    """Template context processor: the user's role and what it allows."""
    role = role_of(getattr(request, "user", None))
    return {
        "event_names": catalogue.names(),  # the browser's copy of the event catalogue
        "model_states": states.browser_sets(),  # and of the state sets (states.py)
        "panel_role": role.label,
        "can_view": role >= Role.VIEWER,
        "can_operate": role >= Role.OPERATOR,
        "can_admin": role >= Role.ADMIN,
    }


UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(value: int | float | str | None) -> str:
    if value is None or value == "":
        return "—"
    size, unit = float(value), 0
    while abs(size) >= 1024 and unit < len(UNITS) - 1:
        size, unit = size / 1024, unit + 1
    return f"{size:.0f} {UNITS[unit]}" if unit == 0 else f"{size:.1f} {UNITS[unit]}"


def human_seconds(value: float | str | None) -> str:
    if value is None or value == "":
        return "—"
    total = float(value)
    seconds = int(total)
    if seconds < 60:
        return f"{total:.1f} s" if total < 10 else f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def error_links(
    form: Any, *formsets: Any, whole: tuple[str, str] = ("preset-form", "Preset")
) -> list[dict[str, str]]:
    """Every error of a posted form as (field id, label, message), for the banner's links
    (templates/panel/_form_errors.html). ``whole``: the form's id and name, for its errors that
    belong to no field."""
    links = []
    for name, errors in form.errors.items():
        if name == "__all__":
            links += [{"href": whole[0], "label": whole[1], "message": e} for e in errors]
            continue
        field = form[name]
        links += [{"href": field.id_for_label, "label": str(field.label), "message": e}
                  for e in errors]  # fmt: skip
    for formset in formsets:
        label = "Option" if formset.prefix == "args" else "Variable"
        for i, row in enumerate(formset.forms, start=1):
            for name, errors in row.errors.items():
                target = row["value" if name == "value" else "key"].id_for_label
                links += [{"href": target, "label": f"{label} {i}", "message": e} for e in errors]
        links += [{"href": f"id_{formset.prefix}-0-key", "label": label, "message": e}
                  for e in formset.non_form_errors()]  # fmt: skip
    for field, errors in getattr(form, "pair_errors", {}).items():
        links += [{"href": f"id_{field}-0-key", "label": field, "message": e} for e in errors]
    return links
