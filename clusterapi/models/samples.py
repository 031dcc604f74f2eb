"""Time series of each broker's heartbeats and queues (charts, the pipeline)."""

from __future__ import annotations

from django.db import models

from clusterapi.models.brokers import Broker


class HeartbeatSample(models.Model):
    """One broker status: the time series behind charts and the traffic pipeline."""

    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="heartbeats")
    time = models.DateTimeField()
    connections = models.IntegerField(default=0)
    consumers = models.IntegerField(default=0)
    queues = models.IntegerField(default=0)
    messages_ready = models.BigIntegerField(default=0)
    messages_unacked = models.BigIntegerField(default=0)
    published_total = models.BigIntegerField(default=0)
    routed_total = models.BigIntegerField(default=0)
    delivered_total = models.BigIntegerField(default=0)
    rate_published = models.FloatField(default=0.0)
    rate_routed = models.FloatField(default=0.0)
    rate_delivered = models.FloatField(default=0.0)
    is_root = models.BooleanField(default=False)
    ready = models.BooleanField(default=False)
    peers_active = models.IntegerField(default=0)
    peers_known = models.IntegerField(default=0)
    peers = models.JSONField(
        default=list, blank=True, help_text="list of {spid, address, active, rtt_ms}"
    )
    # added for the lake (restarts and the root timeline); blank in older rows
    spid = models.CharField(max_length=64, blank=True, help_text="the broker's spid at this status")
    root = models.CharField(max_length=64, blank=True, help_text="spid of the root it saw")
    stopping = models.BooleanField(
        default=False,
        help_text="the broker announced a planned stop after this status (its last)",
    )
    bridged_total = models.BigIntegerField(
        default=0, help_text="messages its bridges forwarded since it started"
    )

    class Meta:
        ordering = ["-time"]
        indexes = [
            models.Index(fields=["broker", "time"], name="heartbeat_broker_time"),
            models.Index(fields=["time"], name="heartbeat_time"),
        ]

    def __str__(self) -> str:
        return f"{self.broker_id}@{self.time:%Y-%m-%d %H:%M:%S}"


class QueueSample(models.Model):
    """One queue's counters at one status (per-queue rates for the pipeline)."""

    #: what each status reports of a queue, after its broker and time (the API's columns)
    REPORTED = (
        "vhost",
        "queue",
        "messages",
        "unacked",
        "consumers",
        "enqueued_total",
        "delivered_total",
        "rate_in",
        "rate_out",
    )

    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="queue_samples")
    time = models.DateTimeField()
    vhost = models.CharField(max_length=255)
    queue = models.CharField(max_length=255)
    messages = models.BigIntegerField(default=0)
    unacked = models.BigIntegerField(default=0)
    consumers = models.IntegerField(default=0)
    enqueued_total = models.BigIntegerField(default=0)
    delivered_total = models.BigIntegerField(default=0)
    rate_in = models.FloatField(default=0.0)
    rate_out = models.FloatField(default=0.0)

    class Meta:
        ordering = ["-time"]
        indexes = [
            models.Index(fields=["broker", "time"], name="queuesample_broker_time"),
            models.Index(fields=["time"], name="queuesample_time"),
        ]

    def __str__(self) -> str:
        return f"{self.vhost}/{self.queue}@{self.time:%Y-%m-%d %H:%M:%S}"
