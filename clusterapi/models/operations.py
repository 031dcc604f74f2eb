"""What the console does and keeps of it: commands, the audit log, alarms, its processes."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from clusterapi.models.brokers import Broker


class Command(models.Model):
    """A command for one broker, delivered (and retried) until acked or timed out."""

    CONFIG_APPLY = "config.apply"
    ROOT_ENABLE = "root.enable"
    ROOT_DISABLE = "root.disable"
    STATE_DUMP = "state.dump"
    #: hand a shared queue to another primary; spread the owners over the primaries
    QUEUE_MOVE = "queue.move"
    QUEUES_REBALANCE = "queues.rebalance"
    #: the root forgets a stopped member for good (``brokerd ctl cluster forget``)
    CLUSTER_FORGET = "cluster.forget"
    #: a primary joins every quorum group that leaves it out, or leaves every group naming
    #: it (``brokerd ctl queues grow|shrink``)
    QUEUES_GROW = "queues.grow"
    QUEUES_SHRINK = "queues.shrink"
    NAME_CHOICES = [
        (CONFIG_APPLY, "config.apply"),
        (ROOT_ENABLE, "root.enable"),
        (ROOT_DISABLE, "root.disable"),
        (STATE_DUMP, "state.dump"),
        (QUEUE_MOVE, "queue.move"),
        (QUEUES_REBALANCE, "queues.rebalance"),
        (CLUSTER_FORGET, "cluster.forget"),
        (QUEUES_GROW, "queues.grow"),
        (QUEUES_SHRINK, "queues.shrink"),
    ]

    STATE_PENDING = "pending"
    STATE_SENT = "sent"
    STATE_ACKED = "acked"
    STATE_FAILED = "failed"
    STATE_TIMED_OUT = "timed_out"
    #: a config.apply that a later push replaced before the broker acked it
    STATE_SUPERSEDED = "superseded"
    STATE_CHOICES = [
        (STATE_PENDING, "pending"),
        (STATE_SENT, "sent"),
        (STATE_ACKED, "acked"),
        (STATE_FAILED, "failed"),
        (STATE_TIMED_OUT, "timed out"),
        (STATE_SUPERSEDED, "superseded"),
    ]
    OPEN_STATES = (STATE_PENDING, STATE_SENT)
    FINAL_STATES = (STATE_ACKED, STATE_FAILED, STATE_TIMED_OUT, STATE_SUPERSEDED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="commands")
    name = models.CharField(max_length=32, choices=NAME_CHOICES)
    args = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=STATE_CHOICES, default=STATE_PENDING)
    attempts = models.IntegerField(default=0, help_text="times sent to the broker")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="first sent")
    last_attempt_at = models.DateTimeField(null=True, blank=True, help_text="last sent")
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(help_text="timed out if not acked by then")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "deadline"], name="command_state_deadline")]

    def __str__(self) -> str:
        return f"{self.name} -> {self.broker_id} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in self.OPEN_STATES


class AuditEntry(models.Model):
    """Who did what, kept even when the user is deleted (``username``)."""

    time = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, help_text='e.g. "command.root.disable", "config.push"')
    target = models.CharField(max_length=255, blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.username or '-'} {self.action} {self.target}"


class Alarm(models.Model):
    """Something an operator should look at; ``active`` until cleared.

    Acknowledging says an operator has seen it: it stays active (the condition
    holds) but no longer counts as needing attention. A cleared alarm raised again
    is a new row, unacknowledged.
    """

    SOURCE_CONSOLE = "console"
    SOURCE_BROKER = "broker"
    SOURCE_CHOICES = [(SOURCE_CONSOLE, "console"), (SOURCE_BROKER, "broker")]

    broker = models.ForeignKey(
        Broker, null=True, blank=True, on_delete=models.CASCADE, related_name="alarms"
    )
    kind = models.CharField(max_length=64, help_text="e.g. broker.down, link.refused")
    message = models.TextField(blank=True)
    source = models.CharField(max_length=16, choices=SOURCE_CHOICES, default=SOURCE_CONSOLE)
    raised_at = models.DateTimeField()
    cleared_at = models.DateTimeField(null=True, blank=True)
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True, help_text="last raised again or changed")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acknowledged_by_name = models.CharField(
        max_length=150, blank=True, help_text="who acknowledged it (kept if the user goes)"
    )
    acknowledgement = models.CharField(max_length=500, blank=True, help_text="their note")

    class Meta:
        ordering = ["-raised_at"]
        indexes = [models.Index(fields=["active", "kind"], name="alarm_active_kind")]

    def __str__(self) -> str:
        where = f" on {self.broker}" if self.broker_id else ""
        return f"{self.kind}{where}"


class ConsoleProcess(models.Model):
    """A console process that serves the broker link (Daphne), as it beats.

    Stale-broker detection (Celery) reads these: a broker is silent because it is down
    only if a console was there to hear it. While no console process beats, nobody is
    judged; after one starts (or one stops, and its brokers move to another), a broker
    last heard before that gets the time to reconnect first (``clusterapi.cluster``).
    """

    host = models.CharField(max_length=255, help_text="host name of the process")
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(help_text="its last beat")

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["beat_at"], name="console_process_beat")]

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"
