"""The console's own views outside the dashboard: the health check."""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe


@require_safe
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe for load balancers and systemd/compose health checks (no login)."""
    return JsonResponse({"status": "ok"})
