"""The Celery app: eager in embedded mode, a real worker over Redis in team mode (settings).

Team mode runs ``celery -A routerpanel worker`` and ``celery -A routerpanel beat -S
django_celery_beat.schedulers:DatabaseScheduler`` (the periodic jobs of ``CELERY_BEAT_SCHEDULE``
and the scheduled preloads admins add in the admin). The tasks are in ``models_app/tasks.py``.
"""

import os

from celery import Celery
from django.apps import apps

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")

app = Celery("routerpanel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

if apps.models_ready:
    # Imported from ModelsAppConfig.ready() (web and router processes): load the tasks now so
    # their receivers (inspect a preset's GGUF when it is saved) are connected there too. A
    # worker imports this module before Django is set up and finds the tasks by autodiscovery.
    import models_app.tasks  # noqa: F401
