"""The archive of heartbeats and the pipeline's report runs."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from clusterapi.models.brokers import Broker


class ArchiveBatch(models.Model):
    """One batch of samples moved from the database into the Parquet lake.

    Planned (an id range and a time cutoff) before its files are written; its
    rows are deleted in the same transaction that marks it done. A batch left
    undone by a crash is redone first, under the same file names, so the lake
    never holds a sample twice (``clusterapi.archive``).
    """

    KIND_HEARTBEATS = "heartbeats"
    KIND_QUEUE_SAMPLES = "queue_samples"
    KIND_CHOICES = [(KIND_HEARTBEATS, "heartbeats"), (KIND_QUEUE_SAMPLES, "queue samples")]

    kind = models.CharField(max_length=16, choices=KIND_CHOICES)
    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="+")
    first_id = models.BigIntegerField()
    last_id = models.BigIntegerField()
    cutoff = models.DateTimeField(help_text="only samples older than this")
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True, db_index=True)
    rows = models.IntegerField(default=0, help_text="samples written")
    files = models.JSONField(default=list, blank=True, help_text="lake files written")

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "archive batches"

    def __str__(self) -> str:
        return f"{self.kind} {self.first_id}-{self.last_id}"

    @property
    def batch_id(self) -> str:
        """The lake batch id: the file name of every partition the batch wrote."""
        prefix = "hb" if self.kind == self.KIND_HEARTBEATS else "qs"
        return f"{prefix}-{self.first_id}-{self.last_id}"


class ReportRun(models.Model):
    """One run of the traffic report job (``pipeline report``) and its summary."""

    STATE_PENDING = "pending"
    STATE_RUNNING = "running"
    STATE_SUCCEEDED = "succeeded"
    STATE_FAILED = "failed"
    STATE_CHOICES = [
        (STATE_PENDING, "waiting to start"),
        (STATE_RUNNING, "running"),
        (STATE_SUCCEEDED, "succeeded"),
        (STATE_FAILED, "failed"),
    ]
    OPEN_STATES = (STATE_PENDING, STATE_RUNNING)

    TRIGGER_MANUAL = "manual"
    TRIGGER_NIGHTLY = "nightly"
    TRIGGER_CHOICES = [(TRIGGER_MANUAL, "manual"), (TRIGGER_NIGHTLY, "nightly")]

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    trigger = models.CharField(max_length=16, choices=TRIGGER_CHOICES, default=TRIGGER_MANUAL)
    state = models.CharField(max_length=16, choices=STATE_CHOICES, default=STATE_PENDING)
    period_from = models.DateTimeField(null=True, blank=True, help_text="empty: the lake's start")
    period_to = models.DateTimeField(
        null=True, blank=True, help_text="exclusive; empty: the lake's end"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    output_path = models.CharField(max_length=1024, blank=True, help_text="the job's --out")
    summary = models.JSONField(null=True, blank=True, help_text="the job's summary.json")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"report {self.pk} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in self.OPEN_STATES
