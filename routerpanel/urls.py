"""URL wiring only: the panel's pages live in models_app.urls, the Django admin under /admin/."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("models_app.urls")),
]
