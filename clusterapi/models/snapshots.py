"""Each broker's current queues, exchanges and bindings, as its last status said."""

from __future__ import annotations

from django.db import models

from clusterapi.models.brokers import Broker


class QueueSnapshot(models.Model):
    """A queue as its broker last reported it."""

    #: what each status reports of a queue (the API's columns; ``queue_type`` is its
    #: ``type`` there)
    REPORTED = (
        "vhost",
        "name",
        "durable",
        "exclusive",
        "auto_delete",
        "shared",
        "master",
        "messages",
        "unacked",
        "consumers",
        "local_consumers",
        "consumer_servers",
        "replicas",
        "enqueued",
        "delivered",
        "arguments",
        "queue_type",
    )

    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="queues")
    vhost = models.CharField(max_length=255)
    name = models.CharField(max_length=255)
    durable = models.BooleanField(default=False)
    exclusive = models.BooleanField(default=False)
    auto_delete = models.BooleanField(default=False)
    shared = models.BooleanField(default=False, help_text="declared cluster-wide")
    master = models.BooleanField(
        default=True,
        help_text="this broker holds the queue's messages (false: a proxy of a shared queue, "
        "whose messages are on its owner)",
    )
    messages = models.BigIntegerField(default=0)
    unacked = models.BigIntegerField(default=0)
    consumers = models.IntegerField(default=0)
    local_consumers = models.IntegerField(
        default=0, help_text="consumers connected to this broker (a master counts others too)"
    )
    consumer_servers = models.JSONField(
        default=dict,
        blank=True,
        help_text="a shared queue's master: {spid: consumers} of every server with consumers",
    )
    replicas = models.JSONField(
        default=list,
        blank=True,
        help_text="a shared queue's master: [{spid, in_sync, behind}] of every server holding "
        "a copy (empty: a classic queue, a root alone, a proxy, a private queue)",
    )
    enqueued = models.BigIntegerField(default=0)
    delivered = models.BigIntegerField(default=0)
    arguments = models.JSONField(default=dict, blank=True)
    queue_type = models.CharField(
        max_length=16,
        blank=True,
        default="",
        help_text="how the broker keeps the queue: classic, quorum or replicated (empty: "
        "not reported)",
    )
    updated_at = models.DateTimeField()

    #: how the cluster keeps a queue (docs/protocol.md, "Queue types")
    KINDS = ("classic", "quorum", "replicated")

    @property
    def kind(self) -> str:
        """``classic`` (a private queue, or a shared one on its owner alone), ``quorum``,
        or ``replicated``: as the broker reported it, else from the declare's type (a
        broker that reports none kept a shared queue without a type replicated)."""
        if self.queue_type in self.KINDS:
            return self.queue_type
        arguments = self.arguments if isinstance(self.arguments, dict) else {}
        named = arguments.get("x-queue-type")
        if named in ("classic", "quorum"):
            return str(named)
        return "replicated" if self.shared else "classic"

    class Meta:
        ordering = ["broker", "vhost", "name"]
        constraints = [
            models.UniqueConstraint(fields=["broker", "vhost", "name"], name="queue_snapshot_key")
        ]
        indexes = [models.Index(fields=["vhost", "name"], name="queue_snapshot_name")]

    def __str__(self) -> str:
        return f"{self.vhost}/{self.name}"


class ExchangeSnapshot(models.Model):
    """An exchange as its broker last reported it."""

    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="exchanges")
    vhost = models.CharField(max_length=255)
    name = models.CharField(max_length=255, blank=True)
    type = models.CharField(max_length=64)
    durable = models.BooleanField(default=False)
    auto_delete = models.BooleanField(default=False)
    internal = models.BooleanField(default=False)
    shared = models.BooleanField(default=False, help_text="cluster wiring, on every server")
    arguments = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["broker", "vhost", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["broker", "vhost", "name"], name="exchange_snapshot_key"
            )
        ]
        indexes = [models.Index(fields=["vhost", "name"], name="exchange_snapshot_name")]

    def __str__(self) -> str:
        return f"{self.vhost}/{self.name or '(default)'}"


class BindingSnapshot(models.Model):
    """A binding as its broker last reported it."""

    DESTINATION_CHOICES = [("queue", "queue"), ("exchange", "exchange")]

    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="bindings")
    vhost = models.CharField(max_length=255)
    source = models.CharField(max_length=255, blank=True)
    destination = models.CharField(max_length=255)
    destination_type = models.CharField(max_length=16, choices=DESTINATION_CHOICES)
    routing_key = models.CharField(max_length=255, blank=True)
    shared = models.BooleanField(
        default=False, help_text="cluster wiring, on every server (not a private queue's)"
    )
    arguments = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["broker", "vhost", "source", "destination"]
        indexes = [
            models.Index(fields=["vhost", "source", "destination"], name="binding_snapshot_route")
        ]
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "broker",
                    "vhost",
                    "source",
                    "destination",
                    "destination_type",
                    "routing_key",
                ],
                name="binding_snapshot_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.vhost}: {self.source} -> {self.destination} ({self.routing_key})"
