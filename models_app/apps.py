from django.apps import AppConfig


class ModelsAppConfig(AppConfig):
    name = "models_app"
    verbose_name = "RouterPanel"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The Celery app is imported here, not from routerpanel/__init__.py, so that importing
        # the engine package stays light (DESIGN §3).
        from django.db.models.signals import post_migrate

        from models_app import checks  # noqa: F401  (registers the system checks)
        from models_app.accounts import signin
        from models_app.accounts.roles import ensure_groups

        # The panel's role groups exist after every migrate, without a data migration.
        post_migrate.connect(ensure_groups, sender=self, dispatch_uid="models_app.accounts.roles")
        signin.connect_signals()  # audit failed and locked-out sign-ins
        from routerpanel import celery  # noqa: F401
