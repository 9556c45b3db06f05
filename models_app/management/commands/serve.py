"""``manage.py serve``: migrate, create the first admin, and serve the panel with Daphne.

This is the foundation's version: it serves the Django admin with the presets. The router
(engine worker, router API and proxy) joins it in the same event loop in the serving issue.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from models_app import bootstrap


class Command(BaseCommand):
    help = "Serve RouterPanel (embedded mode: one process)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="listen address (127.0.0.1)")
        parser.add_argument("--port", type=int, default=8080, help="listen port (8080)")
        parser.add_argument(
            "--models-preset", metavar="FILE", help="import this llama.cpp preset INI at start"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        bootstrap.migrate()
        password = bootstrap.ensure_admin()
        if password:
            self.stdout.write(
                self.style.WARNING(
                    f"Created user '{bootstrap.ADMIN_USERNAME}' with password: {password}\n"
                    "It is shown only this once; change it in the panel."
                )
            )
        if options["models_preset"]:
            from django.core.management import call_command

            call_command("import_presets", options["models_preset"], stdout=self.stdout)
        self._run_daphne(options["host"], options["port"])

    def _run_daphne(self, host: str, port: int) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from routerpanel.asgi import application

        self.stdout.write(f"RouterPanel on http://{host}:{port}/ (admin at /admin/)")
        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=True,
        ).run()
