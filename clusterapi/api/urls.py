"""Routes of the REST admin API, included under ``/api/v1/`` by ``console/urls.py``."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from clusterapi.api import bridge_views, config_views, member_views, reports, root, views

router = SimpleRouter()
router.register("brokers", views.BrokerViewSet, basename="broker")
router.register("queues", views.QueueViewSet, basename="queue")
router.register("exchanges", views.ExchangeViewSet, basename="exchange")
router.register("bindings", views.BindingViewSet, basename="binding")
router.register("heartbeats", views.HeartbeatViewSet, basename="heartbeat")
router.register("queue-samples", views.QueueSampleViewSet, basename="queue-sample")
router.register("configs", config_views.ConfigVersionViewSet, basename="config")
router.register("commands", views.CommandViewSet, basename="command")
router.register("audit", views.AuditViewSet, basename="audit")
router.register("events", views.EventViewSet, basename="event")
router.register("alarms", views.AlarmViewSet, basename="alarm")
router.register("reports", reports.ReportRunViewSet, basename="report")

urlpatterns = [
    path("", root.ApiRootView.as_view(), name="api-root"),
    path("docs/", root.ApiDocsView.as_view(), name="api-docs"),
    path("cluster/", views.ClusterView.as_view(), name="api-cluster"),
    path("cluster/members/", member_views.MembersView.as_view(), name="api-cluster-members"),
    path(
        "cluster/members/forget/",
        member_views.ForgetView.as_view(),
        name="api-cluster-members-forget",
    ),
    # before the router: its queues/{id}/ would take these names for ids
    path("queues/grow/", member_views.GrowView.as_view(), name="api-queues-grow"),
    path("queues/shrink/", member_views.ShrinkView.as_view(), name="api-queues-shrink"),
    path("endpoints/", views.EndpointsView.as_view(), name="api-endpoints"),
    path("bridges/", bridge_views.BridgesView.as_view(), name="api-bridges"),
    *reports.file_routes(),
    *router.urls,
]
