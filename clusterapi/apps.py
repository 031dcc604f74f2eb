from django.apps import AppConfig


class ClusterApiConfig(AppConfig):
    name = "clusterapi"
    verbose_name = "Rookery cluster"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from clusterapi import signals

        signals.connect()
