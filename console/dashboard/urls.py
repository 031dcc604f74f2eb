"""Routes of the dashboard pages and actions (the overview is ``/``, named ``home``)."""

from django.urls import path

from console.dashboard import reports, views

app_name = "dashboard"

urlpatterns = [
    path("brokers/", views.brokers, name="brokers"),
    path("brokers/<str:name>/", views.broker, name="broker"),
    path("brokers/<str:name>/root/", views.broker_root, name="broker-root"),
    path("brokers/<str:name>/dump/", views.broker_dump, name="broker-dump"),
    path("queues/", views.queues, name="queues"),
    path("exchanges/", views.exchanges, name="exchanges"),
    path("bindings/", views.bindings, name="bindings"),
    path("config/", views.config, name="config"),
    path("config/validate/", views.config_validate, name="config-validate"),
    path("commands/", views.command_log, name="commands"),
    path("audit/", views.audit_log, name="audit"),
    path("alarms/", views.alarms, name="alarms"),
    path("reports/", reports.report_list, name="reports"),
    path("reports/run/", reports.report_run, name="report-run"),
    path("reports/<int:pk>/", reports.report_detail, name="report"),
]
