from django.apps import AppConfig


class ClusterApiConfig(AppConfig):
    name = "clusterapi"
    verbose_name = "Rookery cluster"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # configs, groups, members and owners register what the acks of their commands
        # do (commands.on_ack)
        from clusterapi import configs, groups, members, owners, signals  # noqa: F401

        signals.connect()
