"""With DEBUG on, the console answers loopback clients only (DESIGN.md §10).

Django renders its debug pages (a traceback with local variables and settings
for a 500, the URL patterns for a 404) exactly when DEBUG is on, whoever asked.
``make run`` serves the console with DEBUG on, bound to 127.0.0.1; this module
makes "DEBUG is for this machine" a rule rather than a bind address: every
request from anywhere else is refused with a plain 403 before anything that
could fail or render a debug page runs. With DEBUG off nothing changes.

A request counts as local when its peer address is loopback (127.0.0.0/8, ::1,
or ::ffff:127.x) and it carries no proxy forwarding header: behind a proxy on
the same machine (deploy/nginx) every peer is 127.0.0.1, and the header says
the client is somewhere else. No address at all (a Unix socket) is not local.

Two layers, one rule: :class:`LoopbackOnlyDebugMiddleware` first in Django's
middleware (every view, the WSGI entry point, the test client) and
:class:`LoopbackOnlyDebugApp` around the ASGI application (static files served
under DEBUG, which bypass the middleware, and websockets).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable, Mapping

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from clusterapi.api.errors import error_body, is_api
from console.bodylimits import AsgiApp, Receive, Scope, Send, send_plain

log = logging.getLogger(__name__)

REFUSAL = "refused: this console runs with DEBUG on and answers loopback clients only"

#: request headers a proxy adds: their presence means the client is not the peer
FORWARDING_HEADERS = ("x-forwarded-for", "x-real-ip", "forwarded")
_META_FORWARDING = tuple("HTTP_" + h.upper().replace("-", "_") for h in FORWARDING_HEADERS)


def is_loopback(address: str | None) -> bool:
    """Whether ``address`` (an IP as text, maybe with a zone) is a loopback address."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def request_is_local(meta: Mapping[str, object]) -> bool:
    """A Django request's ``META``: loopback peer, no forwarding header."""
    if any(meta.get(name) for name in _META_FORWARDING):
        return False
    address = meta.get("REMOTE_ADDR")
    return is_loopback(address if isinstance(address, str) else None)


def scope_is_local(scope: Scope) -> bool:
    """An ASGI connection's scope: loopback peer, no forwarding header."""
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())
    if any(name.lower().decode("latin-1") in FORWARDING_HEADERS for name, _ in headers):
        return False
    client = scope.get("client")
    return is_loopback(client[0] if client else None)


class LoopbackOnlyDebugMiddleware:
    """First in ``MIDDLEWARE``: with DEBUG on, a request that is not local gets a
    plain 403 (the API's JSON error shape under ``/api/``) and nothing else runs,
    so no view, middleware or error handler can show it a debug page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if settings.DEBUG and not request_is_local(request.META):
            log.warning("refused %s from %s: DEBUG is on", request.path, _peer(request))
            if is_api(request):
                return JsonResponse(error_body(REFUSAL), status=403)
            return HttpResponse(
                f"{REFUSAL}\n", status=403, content_type="text/plain; charset=utf-8"
            )
        return self.get_response(request)


def _peer(request: HttpRequest) -> str:
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    peer = request.META.get("REMOTE_ADDR") or "an unknown address"
    return f"{peer} (forwarded for {forwarded!r})" if forwarded else str(peer)


class LoopbackOnlyDebugApp:
    """The same rule around the ASGI application: an HTTP request gets the plain 403,
    a websocket is refused at its handshake (Daphne answers 403), and lifespan
    events pass through."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and settings.DEBUG and not scope_is_local(scope):
            client = scope.get("client")
            log.warning(
                "refused %s %s from %s: DEBUG is on",
                scope["type"],
                scope.get("path", ""),
                client[0] if client else "an unknown address",
            )
            if scope["type"] == "http":
                await send_plain(send, 403, REFUSAL)
            else:
                await receive()  # websocket.connect: a close before accept refuses it
                await send({"type": "websocket.close", "code": 1008})
            return
        await self.app(scope, receive, send)
