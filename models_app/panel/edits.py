"""Stale edits: a form remembers the version of what it edits, and a save made against an older
version is refused instead of silently overwriting another admin's change.

The version is a fingerprint of the row's editable values (the audited fields) as the form was
opened, carried in a hidden field. At save time the row is read again under a lock; if its values
differ from the fingerprint, someone changed it in between — another admin in the panel, an
import, the Django admin, a script — and the save raises ``Stale``: the page says who changed it
and when (from the audit log) and shows their values beside the ones posted, and nothing is
written. The refused form carries the new fingerprint, so saving it again replaces their change
knowingly. Values, not a counter bumped on every write: a background write of fields nobody edits
(the GGUF facts read after a save) never makes a form stale, and every writer is covered without
having to bump anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django import forms
from django.db.models import Q
from django.utils import timezone

from models_app.models import AuditEvent

SEEN = "seen_version"


def fingerprint(state: dict[str, Any] | None) -> str:
    """The version of a row's editable values; ``None`` (no row) has one too. Values that are
    equal give one version whatever their type (10 and 10.0: a field read back from the database
    may come in another type than the one a new row was made with)."""
    text = json.dumps(_canonical(state), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, Decimal):
        value = float(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def version(state: dict[str, Any] | None) -> str:
    """What a form carries: the fingerprint, and when it was opened (``@`` unix time; the
    audit rows from then on say who changed the row since)."""
    return f"{fingerprint(state)}@{time.time():.3f}"


def add_seen(form: forms.BaseForm, state: dict[str, Any] | None) -> None:
    """Give ``form`` the hidden field holding the version of what it edits as it is opened."""
    form.fields[SEEN] = forms.CharField(
        widget=forms.HiddenInput,
        initial=version(state),
        error_messages={"required": "This form was opened before saves were checked: reload it."},
    )


def add_seen_each(form: forms.BaseForm, states: dict[str, dict[str, Any]]) -> None:
    """The same for a form that picks what it edits when posted (a quota's subject): the
    version of each choice that has a row as the form is opened."""
    versions = {key: version(state) for key, state in states.items()}
    versions["@"] = f"{time.time():.3f}"  # when it was opened, for the choices with no row
    add_seen(form, None)
    form.fields[SEEN].initial = json.dumps(versions, sort_keys=True)


def seen(form: forms.BaseForm, key: str | None = None, absent: Any = None) -> str:
    """The version the posted (valid) form was opened at; with ``key``, that choice's (a
    choice that had no row then: the version of ``absent``)."""
    value = str(form.cleaned_data.get(SEEN, ""))
    if key is None:
        return value
    versions = _versions(value)
    found = versions.get(key)
    return str(found) if found is not None else f"{fingerprint(absent)}@{versions.get('@', '')}"


@dataclass
class Change:
    """Who last changed a row, and when (from its newest audit row)."""

    by: str = ""
    at: datetime | None = None

    @classmethod
    def last(cls, query: Q) -> Change:
        row = AuditEvent.objects.filter(query).order_by("-time", "-pk").first()
        return cls() if row is None else cls(row.actor, row.time)

    def text(self) -> str:
        who = self.by.removeprefix("user:") if self.by else "someone"
        if self.at is None:
            return f"by {who}"
        return f"by {who} at {timezone.localtime(self.at):%H:%M}"


@dataclass
class Stale(Exception):
    """A save refused: ``what`` changed since the form was opened."""

    what: str  # "demo-small", "the router settings", "the quota of user bob"
    change: Change
    theirs: dict[str, Any] | None  # the values now stored; None: deleted
    yours: dict[str, Any]  # the values posted
    labels: dict[str, str] = field(default_factory=dict)
    plural: bool = False  # "the router settings were changed"

    def __str__(self) -> str:
        return self.message

    @property
    def message(self) -> str:
        was = "were" if self.plural else "was"
        since = f"{self.change.text()} after you opened this form"
        if self.theirs is None:
            return f"{self.what} {was} deleted {since}: nothing was saved."
        return (f"{self.what} {was} changed {since} — review their change: nothing was saved. "
                "Save again to replace it with yours.")  # fmt: skip

    @property
    def version(self) -> str:
        return version(self.theirs)

    def rows(self) -> list[tuple[str, Any, Any]]:
        """(label, theirs, yours) for each value the two differ in."""
        theirs = self.theirs or {}
        keys = sorted(set(theirs) | set(self.yours), key=lambda k: (k not in self.labels, k))
        label = self.labels.get
        return [
            (label(k, k.replace("_", " ")), _shown(theirs.get(k)), _shown(self.yours.get(k)))
            for k in keys
            if theirs.get(k) != self.yours.get(k)
        ]


def said(stale: Stale) -> str:
    """The refusal and the values it is about, in one line (for a message on the next page)."""
    values = "; ".join(f"{label}: theirs {theirs}, yours {yours}"
                       for label, theirs, yours in stale.rows())  # fmt: skip
    return f"{stale.message} {values}." if values and stale.theirs is not None else stale.message


def check(
    opened: str,
    current: dict[str, Any] | None,
    yours: dict[str, Any],
    *,
    what: str,
    changed: Q,
    labels: dict[str, str] | None = None,
    plural: bool = False,
) -> None:
    """Raise ``Stale`` unless the row's values (``current``, read under a lock) are still at the
    version ``opened`` (``seen(form)``). ``changed``: the audit rows recording changes to it."""
    carried, _, when = opened.partition("@")
    if fingerprint(current) == carried:
        return
    with contextlib.suppress(ValueError):  # only the changes made since it was opened
        changed &= Q(time__gte=datetime.fromtimestamp(float(when), tz=UTC))
    raise Stale(what, Change.last(changed), current, yours, labels or {}, plural)


def refused(form: forms.BaseForm, stale: Stale) -> None:
    """Show the refusal on the bound form, and let a second save replace their change."""
    data = form.data.copy()
    data[form.add_prefix(SEEN)] = stale.version
    form.data = data
    if not stale.labels:
        stale.labels = labels_of(form)
    form.add_error(None, said(stale))
    form.stale = stale


def labels_of(form: forms.BaseForm) -> dict[str, str]:
    return {name: str(f.label or name.replace("_", " ")) for name, f in form.fields.items()}


def _versions(text: str) -> dict[str, str]:
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _shown(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Iterable) and not isinstance(value, str):
        if isinstance(value, dict):
            return ", ".join(f"{k}={v}" for k, v in value.items()) or "—"
        items = [" ".join(map(str, v)) if isinstance(v, list | tuple) else str(v) for v in value]
        return ", ".join(items) or "—"
    return str(value)
