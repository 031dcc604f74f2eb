from django.apps import AppConfig


class ClusterApiConfig(AppConfig):
    name = "clusterapi"
    verbose_name = "Rookery cluster"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # configs, members and owners register what the acks of their commands do
        # (commands.on_ack)
        from clusterapi import configs, members, owners, signals  # noqa: F401

        signals.connect()
