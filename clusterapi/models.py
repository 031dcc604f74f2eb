"""Models of the cluster as the console sees it.

Brokers report themselves over the broker link (``clusterapi.consumers``): their
identity (``hello``), then a ``status`` every heartbeat, which is kept three ways:
the latest values on :class:`Broker`, a time series (:class:`HeartbeatSample`,
:class:`QueueSample`) for charts and the pipeline, and the current queues,
exchanges and bindings as snapshots. The console's own records are configuration
versions and their application per broker, commands, alarms and the audit log.

Field names are a contract with the REST API and the dashboard (see the
``clusterapi`` helpers' model contract); add, never rename.
"""

from __future__ import annotations

import uuid

from django.conf import settings
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
