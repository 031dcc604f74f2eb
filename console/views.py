"""The console's own views outside the dashboard: the health check, the favicon and the
answer to a locked-out login."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.templatetags.static import static
from django.views.decorators.cache import cache_control, never_cache
from django.views.decorators.http import require_safe
from django.views.generic.base import RedirectView


@require_safe
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe for load balancers and systemd/compose health checks (no login)."""
    return JsonResponse({"status": "ok"})


#: browsers ask for /favicon.ico whatever the page says: send them to the real one
favicon = cache_control(max_age=86400)(
    RedirectView.as_view(url=static("favicon.svg"), permanent=True)
)


def locked_out(request: HttpRequest, response: Any = None, credentials: Any = None) -> HttpResponse:
    """django-axes' answer (``AXES_LOCKOUT_CALLABLE``) once a user and address failed
    to log in too often: the API's JSON error shape under ``/api/``, a page elsewhere,
    both 429 with how long the lockout lasts."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    message = (
        f"too many failed logins: this account is locked for this address for {minutes} "
        "minutes; try again later"
    )
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"error": message, "detail": {"retry_after_minutes": minutes}},
            status=429,
            headers={"Retry-After": str(minutes * 60)},
        )
    page = render(
        request,
        "registration/locked_out.html",
        {"minutes": minutes, "message": message},
        status=429,
    )
    page["Retry-After"] = str(minutes * 60)
    return page
