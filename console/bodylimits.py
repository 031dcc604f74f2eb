"""Request bodies are bounded before anything reads them (DESIGN.md §10, "Web input").

Django reads a body lazily, wherever ``request.POST`` or ``request.body`` is
first touched, so an oversized or hostile one fails in whichever middleware or
view touches it first. :class:`BodyLimitsMiddleware` checks every request at
the door instead, before CSRF, sessions, authentication or any view, the
login-free token endpoint included:

- a body over ``MAX_REQUEST_BODY_BYTES`` (declared or actual) is refused;
- a JSON body (``application/json``, ``application/*+json``) must be UTF-8 and
  nest at most ``MAX_JSON_DEPTH`` arrays/objects (:func:`console.jsonlimits.json_depth`:
  a linear scan, no parse).

Refusals are 400s in the API's error shape (``{"error": ..., "detail": ...}``)
under ``/api/`` and for JSON requests, one line of plain text elsewhere
(dashboard forms); a JSON charset other than UTF-8 is a 415.
:class:`RefuseUnreadableContentType` covers the one thing that breaks before
any middleware runs: a Content-Type that Django cannot parse.
"""

from __future__ import annotations

import codecs
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.request import UnreadablePostError
from django.utils.http import parse_header_parameters

from clusterapi.api.errors import error_body, is_api
from console.environment import ascii_int
from console.jsonlimits import JsonRefused, check_json_depth


def is_json_media(content_type: str) -> bool:
    """``application/json`` and the structured ``+json`` types (RFC 6839)."""
    main, _, sub = content_type.strip().lower().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def refusal(
    request: HttpRequest, status: int, message: str, detail: Any, *, as_json: bool
) -> HttpResponse:
    """The API's error shape for API paths and JSON requests, one line of text elsewhere."""
    if as_json or is_api(request):
        return JsonResponse(error_body(message, detail), status=status)
    return HttpResponse(f"{message}\n", status=status, content_type="text/plain; charset=utf-8")


class BodyLimitsMiddleware:
    """Refuse oversized bodies, and JSON bodies that are not UTF-8 or nest too deeply,
    before any other middleware or view reads them. Early in ``MIDDLEWARE``: CSRF
    reads form bodies, and every view after it may parse one."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = self.check(request)
        return refused if refused is not None else self.get_response(request)

    def check(self, request: HttpRequest) -> HttpResponse | None:
        limit = settings.MAX_REQUEST_BODY_BYTES
        content_type = request.META.get("CONTENT_TYPE", "")
        try:
            media, params = parse_header_parameters(content_type)
        except ValueError:
            return refusal(request, 400, "unreadable Content-Type", None, as_json=False)
        as_json = is_json_media(media)
        declared = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = ascii_int(declared)
        except ValueError:
            length = -1
        if length < 0:
            return refusal(
                request, 400, "Content-Length is not a byte count", None, as_json=as_json
            )
        if length > limit:
            return self.too_big(request, limit, as_json)
        if not as_json:
            return None  # Django's own reader holds form bodies to the same limit
        charset = params.get("charset")
        if charset is not None and not _is_utf8(charset):
            return refusal(
                request,
                415,
                f"JSON must be UTF-8, not {charset!r}",
                {"charset": charset},
                as_json=True,
            )
        try:
            body = request.body  # held to DATA_UPLOAD_MAX_MEMORY_SIZE, also without a length
        except RequestDataTooBig:
            return self.too_big(request, limit, as_json)
        except UnreadablePostError:
            return refusal(request, 400, "the request body could not be read", None, as_json=True)
        try:
            check_json_depth(body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return refusal(
                request,
                400,
                f"the JSON body is not valid UTF-8 (byte {exc.start})",
                {"position": exc.start},
                as_json=True,
            )
        except JsonRefused as exc:
            return refusal(
                request, 400, str(exc), {"max_depth": settings.MAX_JSON_DEPTH}, as_json=True
            )
        return None

    @staticmethod
    def too_big(request: HttpRequest, limit: int, as_json: bool) -> HttpResponse:
        return refusal(
            request,
            400,
            f"request body larger than {limit} bytes",
            {"max_bytes": limit},
            as_json=as_json,
        )


def _is_utf8(charset: str) -> bool:
    try:
        return codecs.lookup(charset).name == "utf-8"
    except LookupError:
        return False


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RefuseUnreadableContentType:
    """ASGI wrapper: a 400 for a Content-Type that Django cannot parse (an RFC 2231
    parameter naming an unknown charset makes Django's request constructor raise,
    before any middleware, and Daphne answers that with a 500)."""

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name.lower() != b"content-type":
                    continue
                try:
                    parse_header_parameters(value.decode("latin-1"))
                except ValueError:
                    await send_plain(send, 400, "unreadable Content-Type")
                    return
        await self.app(scope, receive, send)


async def send_plain(send: Send, status: int, message: str) -> None:
    """A complete plain-text HTTP answer on ``send``."""
    body = f"{message}\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
