"""Browser websocket routes of the dashboard (mounted by ``console/asgi.py``)."""

from django.urls import re_path

from console.dashboard.live import DashboardConsumer

websocket_urlpatterns = [re_path(r"^ws/dashboard/$", DashboardConsumer.as_asgi())]
