"""Django admin for presets, the router settings, API keys and the audit log.

Changes to presets and settings made here are audited with a field-level diff; the audit log
itself is read-only for everyone, superusers included (STYLE 12). Scheduled preloads are
django-celery-beat's periodic tasks (task ``models_app.tasks.preload_model``, args
``["<model>"]``), edited in its own admin section.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.forms.models import construct_instance
from django.http import HttpRequest

from models_app.audit import records as audit
from models_app.models import ApiKey, AuditEvent, AuditKind, Preset, RouterSettings
from models_app.panel import edits

PRESET_KINDS = (AuditKind.PRESET_CREATED, AuditKind.PRESET_CHANGED, AuditKind.PRESET_DELETED)


def stale_checked(
    kind: type[Preset] | type[RouterSettings],
    state: Callable[[Any], dict[str, Any] | None],
    what: Callable[[Any], str],
    changed: Callable[[Any], Q],
) -> type[forms.ModelForm]:
    """The admin's change form for ``kind``, carrying the version it was opened at: a save
    against a newer version (the panel, an import, another admin) is refused with who and when,
    and the refused form carries the new version, as the panel's forms do (edits.py)."""

    class Form(forms.ModelForm):
        seen_version = forms.CharField(widget=forms.HiddenInput, required=False)

        class Meta:
            model = kind
            fields = "__all__"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened = state(self.instance) if self.instance.pk else None
            self.fields[edits.SEEN].initial = edits.version(opened)

        def clean(self) -> dict[str, Any]:
            cleaned: dict[str, Any] = super().clean()
            if self.instance.pk is None:  # adding: there is nothing to be stale against
                return cleaned
            if not cleaned.get(edits.SEEN):
                raise forms.ValidationError(MISSING_VERSION)
            stored = kind.objects.select_for_update().filter(pk=self.instance.pk).first()
            posted = construct_instance(self, copy.copy(self.instance))  # what saving writes
            try:  # the admin's change view runs in a transaction: the row stays locked
                edits.check(edits.seen(self), state(stored) if stored else None,
                            state(posted) or {}, what=what(stored or self.instance),
                            changed=changed(stored or self.instance))  # fmt: skip
            except edits.Stale as stale:
                edits.refused(self, stale)
            return cleaned

    return Form


MISSING_VERSION = "This form was opened before saves were checked: reload it."


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin):
    form = stale_checked(
        Preset, audit.preset_state, lambda p: p.name,
        lambda p: Q(kind__in=PRESET_KINDS, model=p.name),
    )  # fmt: skip
    list_display = ("name", "model_path", "enabled", "pinned", "stop_timeout", "updated_at")
    list_filter = ("enabled", "pinned", "load_on_startup")
    search_fields = ("name", "model_path")
    readonly_fields = ("gguf_facts", "gguf_estimate", "created_at", "updated_at", "updated_by")
    fieldsets = (
        (None, {"fields": ("name", "aliases", "model_path", "enabled", "nodes")}),
        ("llama-server options", {"fields": ("args", "env")}),
        (
            "Lifecycle",
            {"fields": ("stop_timeout", "load_on_startup", "pinned", "ttl", "load_timeout")},
        ),
        ("Memory", {"fields": ("memory_estimate", "gguf_estimate", "gguf_facts")}),
        ("Advanced", {"fields": ("server_bin",)}),
        ("History", {"fields": ("created_at", "updated_at", "updated_by", edits.SEEN)}),
    )

    def save_model(self, request: HttpRequest, obj: Preset, form: Any, change: bool) -> None:
        before = audit.preset_state(Preset.objects.filter(pk=obj.pk).first() if change else None)
        obj.updated_by = request.user
        super().save_model(request, obj, form, change)
        audit.record_preset_change(before, obj, audit.actor_of(request.user))

    def delete_model(self, request: HttpRequest, obj: Preset) -> None:
        before = audit.preset_state(obj)
        super().delete_model(request, obj)
        audit.record_preset_change(before, None, audit.actor_of(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Preset]) -> None:
        for obj in queryset:  # one audit row per preset, as a one-by-one delete would write
            self.delete_model(request, obj)


@admin.register(RouterSettings)
class RouterSettingsAdmin(admin.ModelAdmin):
    form = stale_checked(
        RouterSettings, audit.settings_state, lambda _: "The router settings",
        lambda _: Q(kind=AuditKind.SETTINGS_CHANGED, node=""),
    )  # fmt: skip
    readonly_fields = ("updated_at", "updated_by")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not RouterSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: RouterSettings, form: Any, change: bool
    ) -> None:
        stored = RouterSettings.objects.filter(pk=1).first()
        before = audit.settings_state(stored) if stored is not None else {}
        obj.updated_by = request.user
        super().save_model(request, obj, form, change)
        audit.record_settings_change(before, obj, audit.actor_of(request.user))


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Issue and revoke API keys. The hash is never shown; the key itself only once, on save."""

    list_display = ("name", "owner", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix", "owner__username")
    fields = (
        "owner", "name", "model_patterns", "max_concurrent", "priority", "queue_comments",
        "prefix", "created_at", "last_used_at", "revoked_at",
    )  # fmt: skip
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:  # the key belongs to its owner for good
            return ("owner", *self.readonly_fields)
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        secret = None if change else obj.set_new_secret()
        super().save_model(request, obj, form, change)
        if secret is not None:
            self.message_user(
                request,
                f"API key for {obj.owner}: {secret} — copy it now, it will not be shown again.",
                messages.WARNING,
            )

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        keys = list(queryset.filter(revoked_at__isnull=True))
        for key in keys:
            key.revoke()  # one save each, so that every web process's key cache hears of it
        self.message_user(request, f"Revoked {len(keys)} key(s).", messages.SUCCESS)


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """The audit log, read-only: no add, change or delete for anyone (retention deletes)."""

    list_display = (
        "time", "kind", "model", "actor", "reason", "trigger_model", "queue_depth",
        "stop_seconds", "force_killed",
    )  # fmt: skip
    list_filter = ("kind", "force_killed", ("time", admin.DateFieldListFilter), "actor", "model")
    search_fields = ("model", "actor", "reason", "trigger_model", "trigger_request")
    date_hierarchy = "time"
    list_per_page = 100
    show_full_result_count = False  # the table grows: no COUNT(*) per page

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
