"""ASGI entry point: the router API and proxy as raw ASGI, the panel through Django.

``build_http_app`` answers llama.cpp's router routes and the proxied routes itself (the hot path
skips Django's request machinery) and hands every other path to Django. The protocol router
stays so that WebSocket routes (the dashboard) can be added next to ``http``.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from django.urls import path  # noqa: E402

from models_app.api import build_http_app  # noqa: E402  (needs the apps loaded)
from models_app.panel.consumers import DashboardConsumer  # noqa: E402
from models_app.security import OwnOriginOnly  # noqa: E402

# The panel's one WebSocket: the session's user (AuthMiddlewareStack), from our own origin only
# (scheme, host and port, or CSRF_TRUSTED_ORIGINS): checked before the session is even read.
websocket_app = OwnOriginOnly(
    AuthMiddlewareStack(URLRouter([path("ws/dashboard/", DashboardConsumer.as_asgi())]))
)

http_app = build_http_app(django_asgi_app)  # serve closes its connections to the children
application = ProtocolTypeRouter({"http": http_app, "websocket": websocket_app})
