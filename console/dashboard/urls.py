"""Routes of the dashboard pages and actions (the overview is ``/``, named ``home``)."""

from django.urls import path

from console.dashboard import config_views, reports, views

app_name = "dashboard"

urlpatterns = [
    path("brokers/", views.brokers, name="brokers"),
    path("brokers/<str:name>/", views.broker, name="broker"),
    path("brokers/<str:name>/root/", views.broker_root, name="broker-root"),
    path("brokers/<str:name>/dump/", views.broker_dump, name="broker-dump"),
    path(
        "brokers/<str:name>/decommission/",
        views.broker_decommission,
        name="broker-decommission",
    ),
    path("cluster/members/forget/", views.member_forget, name="member-forget"),
    path("cluster/members/groups/", views.member_groups, name="member-groups"),
    path("queues/", views.queues, name="queues"),
    path("queues/rebalance/", views.queues_rebalance, name="queues-rebalance"),
    path("queues/<int:pk>/", views.queue_detail, name="queue"),
    path("queues/<int:pk>/move/", views.queue_move, name="queue-move"),
    path("exchanges/", views.exchanges, name="exchanges"),
    path("exchanges/<int:pk>/", views.exchange_detail, name="exchange"),
    path("bindings/", views.bindings, name="bindings"),
    path("bindings/<int:pk>/", views.binding_detail, name="binding"),
    path("config/", config_views.config, name="config"),
    path("config/validate/", config_views.config_validate, name="config-validate"),
    path("config/<int:number>/push/", config_views.config_push, name="config-push"),
    path("commands/", views.command_log, name="commands"),
    path("audit/", views.audit_log, name="audit"),
    path("alarms/", views.alarm_list, name="alarms"),
    path("bridges/", views.bridge_list, name="bridges"),
    path("alarms/<int:pk>/acknowledge/", views.alarm_acknowledge, name="alarm-acknowledge"),
    path("reports/", reports.report_list, name="reports"),
    path("reports/run/", reports.report_run, name="report-run"),
    path("reports/<int:pk>/", reports.report_detail, name="report"),
]
