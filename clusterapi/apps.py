from django.apps import AppConfig


class ClusterApiConfig(AppConfig):
    name = "clusterapi"
    verbose_name = "Rookery cluster"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # configs registers what a config.apply ack does (commands.on_ack)
        from clusterapi import configs, signals  # noqa: F401

        signals.connect()
