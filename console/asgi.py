"""ASGI entry point: ``daphne console.asgi:application``.

HTTP goes to Django (with DEBUG, static files too, as ``runserver`` does; in
production nginx serves the collected files). Websockets split in two:

- ``/ws/brokers/``, the broker link (``clusterapi.consumers.BrokerLinkConsumer``):
  brokers are not browsers and send no Origin; they authenticate with their
  bearer token, checked by the consumer before it accepts.
- everything else is for browsers: the origin check (the request's Origin must
  be one of ALLOWED_HOSTS), the session-based auth middleware (``scope["user"]``)
  and the routes in ``websocket_urlpatterns``; a path nobody serves is refused
  at the handshake (HTTP 403) rather than failing with an error.

Around it all: with DEBUG on, only loopback clients are served
(``console.loopback``), and a Content-Type Django cannot parse is a 400
(``console.bodylimits``), not the 500 its request constructor would cause, and a
query string over the limits is a 400 before anything parses it
(``console.querylimits``; Daphne's own line limits: ``console.daphnelimits``).
From its first call on, the process beats (``clusterapi.presence``).
"""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

# Set up Django (apps, models) before importing anything that touches them.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import re_path  # noqa: E402

from clusterapi.consumers import BrokerLinkConsumer, refuse_websocket  # noqa: E402
from clusterapi.presence import start_beating  # noqa: E402
from console import daphnelimits  # noqa: E402
from console.bodylimits import RefuseUnreadableContentType  # noqa: E402
from console.dashboard import routing as dashboard_routing  # noqa: E402
from console.loopback import LoopbackOnlyDebugApp  # noqa: E402
from console.querylimits import RefuseHostileQuery  # noqa: E402

BROKER_LINK_PATHS = frozenset({"/ws/brokers/", "/ws/brokers"})

# Browser websocket consumers: the live dashboard pages.
websocket_urlpatterns: list = [*dashboard_routing.websocket_urlpatterns]

broker_link = BrokerLinkConsumer.as_asgi()

browser_websockets = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter([*websocket_urlpatterns, re_path(r"", refuse_websocket)]))
)


async def websocket_router(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The broker link outside the browser stack; every other path inside it."""
    if scope["path"] in BROKER_LINK_PATHS:
        return await broker_link(scope, receive, send)
    return await browser_websockets(scope, receive, send)


http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

daphnelimits.install()  # an over-long request line or header is answered (414/431)

routed = LoopbackOnlyDebugApp(
    RefuseHostileQuery(
        RefuseUnreadableContentType(
            ProtocolTypeRouter({"http": http_app, "websocket": websocket_router})
        )
    )
)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The console: its process beats from its first call on (``clusterapi.presence``:
    stale-broker detection judges brokers only while a console hears them)."""
    if settings.CONSOLE_BEAT:
        start_beating()
    return await routed(scope, receive, send)
