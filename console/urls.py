"""URLs of the console: the dashboard, admin, login/logout, the REST API (schema, token,
resources), health.

Anything under ``/api/`` answers JSON, errors included: unknown API URLs hit
the catch-all below, and the error handlers answer JSON for API paths.
"""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView

from clusterapi.api import errors as api_errors
from clusterapi.api.views import TokenView
from console import views
from console.dashboard import views as dashboard_views

admin.site.site_header = "Rookery console administration"
admin.site.site_title = "Rookery console"

urlpatterns = [
    path("", dashboard_views.overview, name="home"),
    path("", include("console.dashboard.urls")),
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("admin/", admin.site.urls),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # REST admin API (version 1).
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/auth/token/", TokenView.as_view(), name="api-token"),
    path("api/v1/", include("clusterapi.api.urls")),
    re_path(r"^api/", api_errors.api_not_found, name="api-not-found"),
]

handler400 = api_errors.bad_request
handler403 = api_errors.permission_denied
handler404 = api_errors.page_not_found
handler500 = api_errors.server_error
