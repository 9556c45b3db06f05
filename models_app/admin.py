"""Django admin for presets and the router settings (issue 5 adds the panel's own editor)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from models_app.models import Preset, RouterSettings


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin):
    list_display = ("name", "model_path", "enabled", "pinned", "stop_timeout", "updated_at")
    list_filter = ("enabled", "pinned", "load_on_startup")
    search_fields = ("name", "model_path")
    readonly_fields = ("gguf_facts", "gguf_estimate", "created_at", "updated_at", "updated_by")
    fieldsets = (
        (None, {"fields": ("name", "aliases", "model_path", "enabled")}),
        ("llama-server options", {"fields": ("args", "env")}),
        (
            "Lifecycle",
            {"fields": ("stop_timeout", "load_on_startup", "pinned", "ttl", "load_timeout")},
        ),
        ("Memory", {"fields": ("memory_estimate", "gguf_estimate", "gguf_facts")}),
        ("Advanced", {"fields": ("server_bin",)}),
        ("History", {"fields": ("created_at", "updated_at", "updated_by")}),
    )

    def save_model(self, request: HttpRequest, obj: Preset, form: Any, change: bool) -> None:
        obj.updated_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)


@admin.register(RouterSettings)
class RouterSettingsAdmin(admin.ModelAdmin):
    readonly_fields = ("updated_at", "updated_by")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not RouterSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: RouterSettings, form: Any, change: bool
    ) -> None:
        obj.updated_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
