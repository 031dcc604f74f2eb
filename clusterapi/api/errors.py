"""One error shape for the whole API: ``{"error": "<message>", "detail": ...}``.

``error`` is a sentence a person can act on; ``detail`` keeps DRF's structured
detail (per-field messages for a 400) for programs. Django-level handlers give
the same shape for anything under ``/api/`` that never reaches a DRF view
(unknown URLs, a crash), so no API client ever receives an HTML page.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from clusterapi.errors import Conflict, InvalidDocument, InvalidRequest, NoAnswer, Unavailable

log = logging.getLogger(__name__)

API_PREFIX = "/api/"


class UnprocessableError(exceptions.APIException):
    """422: a configuration document that breaks the document's rules."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "the document breaks the configuration rules"
    default_code = "invalid_document"


class ConflictError(exceptions.APIException):
    """409: the target cannot do what was asked now (the detail says why)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "the target cannot do this now"
    default_code = "conflict"


class UnavailableError(exceptions.APIException):
    """503: no broker that could answer is linked to the console now."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "no broker can answer now"
    default_code = "unavailable"


class NoAnswerError(exceptions.APIException):
    """504: the broker did not answer the command in time (it may still carry it out)."""

    status_code = status.HTTP_504_GATEWAY_TIMEOUT
    default_detail = "the broker did not answer in time"
    default_code = "no_answer"


def error_body(message: str, detail: Any = None) -> dict[str, Any]:
    return {"error": message, "detail": detail}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, reshaped; service-level bad requests become 400s.

    Returns None for anything else, which DRF re-raises and Django answers with
    :func:`server_error` (a logged 500 with a JSON body).
    """
    if isinstance(exc, Conflict):
        exc = ConflictError(exc.message)
    elif isinstance(exc, Unavailable):
        exc = UnavailableError(exc.message)
    elif isinstance(exc, NoAnswer):
        exc = NoAnswerError(exc.message)
    elif isinstance(exc, InvalidDocument):
        exc = UnprocessableError(exc.message)
    elif isinstance(exc, InvalidRequest):
        exc = exceptions.ValidationError({"detail": exc.message})
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError({"detail": "; ".join(exc.messages)})
    elif isinstance(exc, SuspiciousOperation):
        # too many fields, a malformed multipart body...: Django's answer is a 400 too
        exc = exceptions.ParseError(str(exc) or "bad request")
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    response.data = error_body(_message(response.status_code, response.data), response.data)
    return response


def _message(status_code: int, data: Any) -> str:
    """A one-line summary of DRF's error data (``{"detail": ...}`` or per-field lists)."""
    if isinstance(data, dict) and set(data) == {"detail"}:
        return _first(data["detail"])
    if isinstance(data, dict) and data:
        parts = []
        for field, problems in data.items():
            text = _first(problems)
            parts.append(text if field in ("detail", "non_field_errors") else f"{field}: {text}")
        return "; ".join(parts)
    if isinstance(data, list) and data:
        return _first(data)
    return _STATUS_MESSAGES.get(status_code, f"request failed with status {status_code}")


def _first(value: Any) -> str:
    """The first message in a nested structure of error strings."""
    while isinstance(value, list | tuple) and value:
        value = value[0]
    if isinstance(value, dict) and value:
        key, inner = next(iter(value.items()))
        return f"{key}: {_first(inner)}"
    return str(value)


_STATUS_MESSAGES = {
    status.HTTP_400_BAD_REQUEST: "bad request",
    status.HTTP_403_FORBIDDEN: "forbidden",
    status.HTTP_404_NOT_FOUND: "not found",
    status.HTTP_409_CONFLICT: "the target cannot do this now",
    status.HTTP_422_UNPROCESSABLE_ENTITY: "the document breaks the configuration rules",
    status.HTTP_500_INTERNAL_SERVER_ERROR: "internal server error; the console's log has the cause",
    status.HTTP_503_SERVICE_UNAVAILABLE: "no broker can answer now",
    status.HTTP_504_GATEWAY_TIMEOUT: "the broker did not answer in time",
}


# -- Django-level handlers (console/urls.py): JSON under /api/, Django's pages elsewhere --------


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


@csrf_exempt  # a POST to an unknown URL is a 404, not a CSRF failure
def api_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Catch-all for unknown ``/api/`` URLs (also with DEBUG on, where handler404 is unused)."""
    path = request.path
    hint = ""
    if not path.endswith("/"):
        from django.urls import Resolver404, resolve

        try:
            match = resolve(path + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not api_not_found:
            hint = f"; did you mean {path}/ (API URLs end with a slash)?"
    return JsonResponse(error_body(f"no API endpoint at {path}{hint}", {"path": path}), status=404)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return api_not_found(request)
    from django.views import defaults

    return defaults.page_not_found(request, exception or Http404())


def server_error(request: HttpRequest) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body(_STATUS_MESSAGES[500]), status=500)
    from django.views import defaults

    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body("bad request", str(exception or "")), status=400)
    from django.views import defaults

    return defaults.bad_request(request, exception or Exception("bad request"))


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api(request):
        return JsonResponse(error_body("forbidden", str(exception or "")), status=403)
    from django.views import defaults

    return defaults.permission_denied(request, exception or DjangoPermissionDenied())


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: JSON under ``/api/`` (a session request without the CSRF
    token), Django's page elsewhere."""
    if is_api(request):
        message = (
            "CSRF check failed: a request with the session cookie needs the X-CSRFToken "
            "header (or use 'Authorization: Token <token>')"
        )
        return JsonResponse(error_body(message, reason), status=403)
    from django.views.csrf import csrf_failure as django_csrf_failure

    return django_csrf_failure(request, reason)
