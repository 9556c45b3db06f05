from django.apps import AppConfig


class ModelsAppConfig(AppConfig):
    name = "models_app"
    verbose_name = "RouterPanel"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The Celery app is imported here, not from routerpanel/__init__.py, so that importing
        # the engine package stays light (DESIGN §3).
        from models_app import checks  # noqa: F401  (registers the system checks)
        from routerpanel import celery  # noqa: F401
