"""Configuration versions and their application per broker."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from clusterapi.models.brokers import Broker


class ConfigVersionQuerySet(models.QuerySet["ConfigVersion"]):
    def current(self) -> ConfigVersion | None:
        """The version every broker should run: the one pushed last (then the newest)."""
        return self.order_by(models.F("push_serial").desc(nulls_last=True), "-number").first()


class ConfigVersion(models.Model):
    """A saved cluster configuration document (docs/protocol.md): complete (a missing key
    means the broker's own setting), one version per distinct document, never edited.

    The current version is the one pushed last (``push_serial``), so an older version
    can be pushed again without copying it into a new one.
    """

    number = models.PositiveIntegerField(unique=True)
    document = models.JSONField(default=dict)
    checksum = models.CharField(max_length=16, help_text="the checksum brokers report running")
    comment = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    push_serial = models.PositiveIntegerField(
        null=True, blank=True, unique=True, help_text="order of the last push; highest: current"
    )
    pushed_at = models.DateTimeField(null=True, blank=True, help_text="last pushed")

    objects = ConfigVersionQuerySet.as_manager()

    class Meta:
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"version {self.number}"


class ConfigApplication(models.Model):
    """Whether one broker applied one configuration version (convergence)."""

    STATE_PENDING = "pending"
    STATE_ACKED = "acked"
    STATE_FAILED = "failed"
    STATE_SUPERSEDED = "superseded"
    STATE_CHOICES = [
        (STATE_PENDING, "pending"),
        (STATE_ACKED, "acked"),
        (STATE_FAILED, "failed"),
        (STATE_SUPERSEDED, "superseded"),
    ]

    version = models.ForeignKey(
        ConfigVersion, on_delete=models.CASCADE, related_name="applications"
    )
    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="config_applications")
    state = models.CharField(max_length=16, choices=STATE_CHOICES, default=STATE_PENDING)
    checksum = models.CharField(max_length=64, blank=True, help_text="as the broker acked it")
    error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-version__number", "broker__name"]
        constraints = [
            models.UniqueConstraint(fields=["version", "broker"], name="config_application_key")
        ]

    def __str__(self) -> str:
        return f"{self.version} on {self.broker}: {self.state}"
