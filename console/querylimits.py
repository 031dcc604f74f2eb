"""Query strings are bounded before anything parses them (DESIGN.md §10, "Web input").

Django parses a query string lazily (``request.GET``, a websocket consumer's
``QueryDict``) and raises ``TooManyFieldsSent`` past
``DATA_UPLOAD_MAX_NUMBER_FIELDS`` fields wherever that happens first: in DRF's
content negotiation, in a template, in the live page's consumer, and several of
those answered 500. :class:`RefuseHostileQuery` checks every HTTP request and
websocket handshake at the door instead, before Django or Channels:

- more than ``MAX_QUERY_STRING_BYTES`` bytes, or more fields than
  ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (counted as Django counts them: one more than
  the ``&`` separators) is a 400 (the API's JSON error shape under ``/api/``, a
  line of plain text elsewhere); a websocket handshake is refused (HTTP 403).

The request line and headers themselves are bounded by the server in front: Daphne
(Twisted) answers a request whose line or headers pass 16 KB with a 400
(``console.daphnelimits`` makes it answer a single over-long line too, which
Twisted would drop without a word), nginx (deploy/nginx/rookery.conf) with its own
414/400 first.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

from clusterapi.api.errors import API_PREFIX, error_body
from console.bodylimits import send_plain

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def query_problem(query: bytes) -> tuple[str, dict[str, int]] | None:
    """Why a query string is refused (a message and its limit), or None."""
    limit = settings.MAX_QUERY_STRING_BYTES
    if len(query) > limit:
        return f"query string longer than {limit} bytes", {"max_bytes": limit}
    fields = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    if fields is not None and query and query.count(b"&") + 1 > fields:
        return f"query string with more than {fields} fields", {"max_fields": fields}
    return None


class RefuseHostileQuery:
    """ASGI wrapper: a 400 (HTTP) or a refused handshake (websocket) for a query string
    over the limits, before anything parses it."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = query_problem(scope.get("query_string") or b"")
            if problem is not None:
                if scope["type"] == "http":
                    await _refuse_http(scope, send, *problem)
                else:
                    await receive()  # websocket.connect
                    await send({"type": "websocket.close", "code": 1008})
                return
        await self.app(scope, receive, send)


async def _refuse_http(scope: Scope, send: Send, message: str, detail: dict[str, int]) -> None:
    if not str(scope.get("path", "")).startswith(API_PREFIX):
        await send_plain(send, 400, message)
        return
    body = json.dumps(error_body(message, detail)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
