"""The Celery app: eager in embedded mode, a real worker over Redis in team mode (settings)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")

app = Celery("routerpanel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
