"""ASGI entry point: HTTP through Django for now; issue 3 adds the router API and WebSockets."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

application = ProtocolTypeRouter({"http": django_asgi_app})
