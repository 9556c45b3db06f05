"""The panel's pages (namespace ``panel``). API paths (/v1/, /models/, /slots/, /health, …) never
reach Django: the ASGI dispatcher answers them first, so none of these may start with those."""

from django.contrib.auth import views as auth_views
from django.urls import path

from models_app.panel.views import (
    admin_pages,
    audit_log,
    dashboard,
    logs,
    presets,
    reservations,
    usage,
)

app_name = "panel"

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(template_name="panel/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("actions/model/", dashboard.model_action, name="model_action"),
    path("memory/history/", dashboard.memory_history, name="memory_history"),
    path("presets/", presets.preset_list, name="preset_list"),
    path("presets/new/", presets.preset_create, name="preset_create"),
    path("presets/import/", presets.preset_import, name="preset_import"),
    path("presets/export/", presets.preset_export, name="preset_export"),
    path("presets/<int:pk>/", presets.preset_detail, name="preset_detail"),
    path("presets/<int:pk>/edit/", presets.preset_edit, name="preset_edit"),
    path("presets/<int:pk>/clone/", presets.preset_clone, name="preset_clone"),
    path("presets/<int:pk>/delete/", presets.preset_delete, name="preset_delete"),
    path("audit/", audit_log.audit_list, name="audit"),
    path("audit/<int:pk>/", audit_log.audit_detail, name="audit_detail"),
    path("usage/", usage.usage_page, name="usage"),
    path("usage/quotas/", usage.quota_set, name="quota_set"),
    path("reservations/", reservations.reservation_page, name="reservations"),
    path("reservations/new/", reservations.reservation_create, name="reservation_create"),
    path(
        "reservations/<int:pk>/delete/",
        reservations.reservation_delete,
        name="reservation_delete",
    ),
    path("logs/<path:model>/", logs.model_logs, name="logs"),
    # No trailing slash: a model name may hold "/", and logs/x.log/ is the page of "x.log".
    path("logs/<path:model>.log", logs.model_logs_text, name="logs_text"),
    path("settings/", admin_pages.settings_page, name="settings"),
    path("settings/nodes/<str:node>/", admin_pages.node_settings, name="node_settings"),
    path("keys/", admin_pages.api_keys, name="api_keys"),
    path("keys/<int:pk>/scope/", admin_pages.api_key_scope, name="api_key_scope"),
    path("keys/<int:pk>/revoke/", admin_pages.api_key_revoke, name="api_key_revoke"),
    path("users/", admin_pages.users, name="users"),
    path("users/<int:pk>/role/", admin_pages.user_role, name="user_role"),
    path("users/unlock/", admin_pages.user_unlock, name="user_unlock"),
]
