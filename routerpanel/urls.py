"""URL wiring only: the panel's pages live in models_app.urls, the Django admin under /admin/."""

from django.contrib import admin
from django.urls import include, path

# A host name missing from ALLOWED_HOSTS gets a page that says so, not a bare 400.
handler400 = "models_app.panel.views.signin.bad_request"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("models_app.urls")),
]
