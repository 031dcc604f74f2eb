"""The brokers the console knows and what happened to them."""

from __future__ import annotations

from django.db import models


class BrokerQuerySet(models.QuerySet["Broker"]):
    def active(self) -> BrokerQuerySet:
        """Every broker but the retired ones: what lists and counts show."""
        return self.exclude(state=Broker.STATE_RETIRED)


class Broker(models.Model):
    """One brokerd, identified across restarts by its callback ``host:port``.

    A broker an operator decommissioned stays as a row in state ``retired`` (its samples
    and commands are history); if a broker links again under that name, the same row
    becomes active again (``ingest.register_hello``).
    """

    TYPE_PRIMARY = "primary"
    TYPE_SECONDARY = "secondary"
    TYPE_STANDALONE = "standalone"
    TYPE_CHOICES = [
        (TYPE_PRIMARY, "primary"),
        (TYPE_SECONDARY, "secondary"),
        (TYPE_STANDALONE, "standalone"),
    ]

    STATE_UP = "up"
    STATE_DOWN = "down"
    STATE_UNKNOWN = "unknown"
    STATE_RETIRED = "retired"
    #: announced a planned stop (``stopping``) before its link closed: no down alarm
    STATE_STOPPED = "stopped"
    STATE_CHOICES = [
        (STATE_UP, "up"),
        (STATE_DOWN, "down"),
        (STATE_UNKNOWN, "unknown"),
        (STATE_RETIRED, "retired"),
        (STATE_STOPPED, "stopped"),
    ]
    #: not running: commands wait, pushes skip it
    NOT_RUNNING_STATES = (STATE_DOWN, STATE_STOPPED)

    name = models.CharField(
        max_length=255, unique=True, help_text="stable name: the broker's callback host:port"
    )
    spid = models.CharField(max_length=64, blank=True, help_text="server process id of this run")
    address = models.CharField(max_length=255, blank=True, help_text="host:port for clients")
    host = models.CharField(
        max_length=255,
        blank=True,
        db_index=True,
        help_text="the host:port of the brokerd --workers host this broker is a worker of "
        "(blank: a broker of its own)",
    )
    worker = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="its index among the host's workers (null: no host)"
    )
    host_workers = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="the host's worker count, as the worker last said"
    )
    broker_type = models.CharField(max_length=16, choices=TYPE_CHOICES, default=TYPE_STANDALONE)
    version = models.CharField(max_length=64, blank=True)
    cluster = models.CharField(max_length=255, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    checksum = models.CharField(max_length=64, blank=True, help_text="known-hosts checksum")
    state = models.CharField(max_length=16, choices=STATE_CHOICES, default=STATE_UNKNOWN)
    connected = models.BooleanField(default=False, help_text="the broker link is open now")
    link_channel = models.CharField(
        max_length=255,
        blank=True,
        editable=False,
        help_text="channel name of the open link",
    )
    # (so that an old link closing late does not mark a reconnected broker disconnected)
    last_seen = models.DateTimeField(null=True, blank=True, help_text="last hello or status")
    is_root = models.BooleanField(default=False)
    root_enabled = models.BooleanField(default=True)
    ready = models.BooleanField(default=False)
    quorum = models.CharField(max_length=255, blank=True)
    config_version = models.IntegerField(
        null=True, blank=True, help_text="console configuration version applied in this run"
    )
    config_checksum = models.CharField(max_length=64, blank=True)
    counts = models.JSONField(default=dict, blank=True)
    totals = models.JSONField(default=dict, blank=True)
    rates = models.JSONField(default=dict, blank=True)
    view = models.JSONField(default=dict, blank=True, help_text="the last status's cluster view")
    heartbeat_interval = models.FloatField(default=1.0, help_text="seconds between statuses")
    retired_at = models.DateTimeField(
        null=True, blank=True, help_text="when an operator decommissioned it (null: in service)"
    )
    in_force = models.JSONField(
        null=True,
        blank=True,
        help_text="the configuration it runs, as it last reported it: {document, sources} "
        "(null: not reported in this run)",
    )
    in_force_at = models.DateTimeField(null=True, blank=True, help_text="when in_force came")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = BrokerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class BrokerEvent(models.Model):
    """Something that happened to one broker, for its page and for history: a restart
    (a new spid at the same name), a planned stop, a link lost without one.

    Alarms say what needs attention now; events say what happened, kept when the
    condition is long over (an alarm of a crash clears at the next hello).
    """

    KIND_RESTART = "restart"
    KIND_STOPPING = "stopping"
    KIND_LINK_LOST = "link_lost"
    KIND_CHOICES = [
        (KIND_RESTART, "restart"),
        (KIND_STOPPING, "planned stop"),
        (KIND_LINK_LOST, "link lost"),
    ]
    LEVEL_INFO = "info"
    LEVEL_WARNING = "warning"
    LEVEL_CHOICES = [(LEVEL_INFO, "info"), (LEVEL_WARNING, "warning")]

    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField()
    kind = models.CharField(max_length=32, choices=KIND_CHOICES)
    level = models.CharField(max_length=16, choices=LEVEL_CHOICES, default=LEVEL_INFO)
    message = models.TextField(blank=True)
    details = models.JSONField(
        default=dict, blank=True, help_text="e.g. old_spid, new_spid, downtime_seconds"
    )

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["broker", "time"], name="brokerevent_broker_time")]

    def __str__(self) -> str:
        return f"{self.kind} of {self.broker} at {self.time:%Y-%m-%d %H:%M:%S}"
