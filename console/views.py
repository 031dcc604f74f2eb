"""The console's own views: health check and the signed-in landing page."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe


@require_safe
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe for load balancers and systemd/compose health checks (no login)."""
    return JsonResponse({"status": "ok"})


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Where a login lands until the dashboard replaces it."""
    return render(request, "home.html")
