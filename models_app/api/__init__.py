"""llama.cpp's router API and the OpenAI/Anthropic/llama.cpp proxy, as raw ASGI (DESIGN §5).

``build_http_app(django_app)`` returns the HTTP application: ``app`` dispatches, ``routes`` answers
the router's own routes, ``listing`` renders ``/models``, ``sse`` streams ``/models/sse``,
``proxy`` forwards to children through ``upstream``'s pools while ``lease`` keeps the router's
lease, ``auth`` checks API keys, ``request`` and ``errors`` hold the ASGI and error plumbing.
"""

from models_app.api.app import Api, build_http_app
from models_app.api.config import ApiConfig

__all__ = ["Api", "ApiConfig", "build_http_app"]
