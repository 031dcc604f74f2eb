"""URLs of the console: admin, login/logout, the REST API's schema and token, health."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.authtoken.views import obtain_auth_token

from console import views

admin.site.site_header = "Rookery console administration"
admin.site.site_title = "Rookery console"

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # REST admin API (version 1). The resources come with the clusterapi app's API.
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/auth/token/", obtain_auth_token, name="api-token"),
]
