"""JSON shapes of the API. Field names follow ``clusterapi.models`` (a contract)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.authtoken.serializers import AuthTokenSerializer

from clusterapi import configs, convergence, passwords
from clusterapi.api.schema import ErrorSerializer
from clusterapi.api.strict import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
)
from clusterapi.models import (
    Alarm,
    AuditEntry,
    Broker,
    BrokerEvent,
    Command,
    ConfigVersion,
    HeartbeatSample,
    QueueSample,
)
from clusterapi.owners import DEFAULT_VHOST

__all__ = ["ErrorSerializer"]  # re-exported: the API's views import it from here too


class RootRefSerializer(serializers.Serializer):
    name = serializers.CharField()
    spid = serializers.CharField()


class ClusterStateSerializer(serializers.Serializer):
    clustered = serializers.BooleanField(
        help_text="brokers of a cluster link to the console (false: only standalone brokers "
        "and hosts' workers, which have no cluster root)"
    )
    root = RootRefSerializer(allow_null=True, help_text="the broker every member agrees on")
    ready = serializers.BooleanField()
    quorum = serializers.CharField(allow_blank=True)
    brokers_up = serializers.IntegerField()
    brokers_total = serializers.IntegerField()
    config_version = serializers.IntegerField(
        allow_null=True, help_text="the current configuration version (pushed last)"
    )
    alarms_active = serializers.IntegerField()
    alarms_unacknowledged = serializers.IntegerField(help_text="active, not acknowledged yet")
    queues = serializers.IntegerField(
        help_text="queues of the cluster: a shared queue once, a private one per broker"
    )
    shared_queues = serializers.IntegerField(help_text="of which shared (one per cluster)")
    exchanges = serializers.IntegerField(help_text="exchanges: a shared one (wiring) once")
    bindings = serializers.IntegerField(help_text="bindings: a shared one (wiring) once")
    messages_ready = serializers.IntegerField(
        help_text="messages ready in the queues of the brokers that are up (a shared queue's "
        "on its master only)"
    )


class BrokerSerializer(serializers.ModelSerializer):
    heartbeat_age = serializers.SerializerMethodField(
        help_text="seconds since the last hello or status (null: never heard)"
    )
    queues_held = serializers.IntegerField(
        read_only=True,
        help_text="queues whose messages the broker holds: its private queues and the shared "
        "queues it owns; `counts.queues` also counts its proxies",
    )
    shared_owned = serializers.IntegerField(
        read_only=True,
        help_text="shared queues the broker owns (masters): on the root, the replicated and "
        "quorum ones; on every primary, the classic ones placed on it",
    )

    class Meta:
        model = Broker
        fields = [
            "id",
            "name",
            "spid",
            "address",
            "host",
            "worker",
            "host_workers",
            "broker_type",
            "version",
            "cluster",
            "start_time",
            "checksum",
            "state",
            "connected",
            "last_seen",
            "heartbeat_age",
            "heartbeat_interval",
            "is_root",
            "root_enabled",
            "ready",
            "quorum",
            "config_version",
            "config_checksum",
            "retired_at",
            "in_force",
            "in_force_at",
            "queues_held",
            "shared_owned",
            "counts",
            "totals",
            "rates",
            "view",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_heartbeat_age(self, broker: Broker) -> float | None:
        if broker.last_seen is None:
            return None
        return round((timezone.now() - broker.last_seen).total_seconds(), 3)


class BrokerNameField(serializers.SlugRelatedField):
    """A related broker shown by its name (``host:port``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        super().__init__(slug_field="name", **kwargs)


# A row one broker reported: ``broker`` by name, ``broker_id`` beside it. (A comment, not a
# docstring: drf-spectacular would copy a docstring into every subclass's schema.)
class BrokerRowSerializer(serializers.ModelSerializer):
    broker = BrokerNameField()

    #: the leading fields of every such row
    FIELDS = ["id", "broker", "broker_id"]


class HeartbeatSerializer(BrokerRowSerializer):
    class Meta:
        model = HeartbeatSample
        fields = [
            *BrokerRowSerializer.FIELDS,
            "time",
            "connections",
            "consumers",
            "queues",
            "messages_ready",
            "messages_unacked",
            "published_total",
            "routed_total",
            "delivered_total",
            "bridged_total",
            "rate_published",
            "rate_routed",
            "rate_delivered",
            "is_root",
            "ready",
            "peers_active",
            "peers_known",
            "peers",
        ]
        read_only_fields = fields


class QueueSampleSerializer(BrokerRowSerializer):
    class Meta:
        model = QueueSample
        fields = [*BrokerRowSerializer.FIELDS, "time", *QueueSample.REPORTED]
        read_only_fields = fields


class UsernameField(serializers.SlugRelatedField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        super().__init__(slug_field="username", **kwargs)


class CommandSerializer(BrokerRowSerializer):
    created_by = UsernameField(allow_null=True)

    def to_representation(self, instance: Command) -> dict[str, Any]:
        """A ``config.apply``'s document without password hashes (``passwords``)."""
        data = super().to_representation(instance)
        data["args"] = passwords.hidden_args(instance.name, data.get("args"))
        return data

    class Meta:
        model = Command
        fields = [
            *BrokerRowSerializer.FIELDS,
            "name",
            "args",
            "state",
            "attempts",
            "result",
            "error",
            "created_by",
            "created_at",
            "sent_at",
            "last_attempt_at",
            "finished_at",
            "deadline",
        ]
        read_only_fields = fields


class RootRequestSerializer(StrictSerializer):
    enabled = StrictBooleanField(
        help_text="true: the broker may be elected root; false: it steps down and abstains"
    )


# No fields: the dump text arrives in the command's result.dump once acked. (A comment:
# a docstring would become the schema's description of the body.)
class DumpRequestSerializer(StrictSerializer):
    pass


class DecommissionRequestSerializer(StrictSerializer):
    confirm = StrictCharField(
        max_length=255,
        help_text="the broker's name (host:port), typed again: retiring is for a server "
        "that is gone for good",
    )


class DecommissionSerializer(serializers.Serializer):
    broker = serializers.CharField(help_text="the retired broker's name")
    retired_at = serializers.DateTimeField()
    alarms_closed = serializers.IntegerField(help_text="its alarms that were still active")
    next = serializers.ListField(
        child=serializers.CharField(),
        help_text="what to do so the servers forget it too: the cluster file is the authority",
    )


class QueueMoveSerializer(StrictSerializer):
    to = StrictCharField(
        max_length=255,
        trim_whitespace=False,
        help_text="the primary to own the queue: its name (host:port) or the spid of its "
        "current run",
    )


class RebalanceSerializer(StrictSerializer):
    vhost = StrictCharField(
        max_length=255,
        trim_whitespace=False,
        required=False,
        default=DEFAULT_VHOST,
        help_text=f"the virtual host whose shared queues are spread (default {DEFAULT_VHOST!r})",
    )


class ConvergenceSerializer(serializers.Serializer):
    broker = serializers.CharField(help_text="broker name")
    state = serializers.ChoiceField(
        choices=convergence.STATES,
        help_text="running: reports running this version; pending: a push is on its way; "
        "failed: refused it (see error); drifted: runs something else, nothing on its way; "
        "down: not reporting; not_running: (an older version) runs another one",
    )
    checksum = serializers.CharField(
        allow_blank=True, help_text="checksum of what the broker reports running (empty: its files)"
    )
    running = serializers.CharField(help_text="what the broker reports running, in words")
    running_version = serializers.IntegerField(
        allow_null=True, help_text="the version with that checksum (null: none)"
    )
    error = serializers.CharField(allow_blank=True, help_text="why a push was refused")
    differences = serializers.JSONField(
        allow_null=True,
        help_text="the version against the configuration the broker reports in force, per key: "
        "key, status (added: only on the broker, removed: only in the version, changed), "
        "version, broker, source (console, file or default); null: not reported",
    )


class UnsetKeySerializer(serializers.Serializer):
    key = serializers.CharField()
    default = serializers.CharField(help_text="what the key's absence means on the brokers")


class DocumentField(serializers.JSONField):
    """A configuration document as readers get it: users without password hashes, which
    are write-only (a user sent back without one keeps it: ``clusterapi.passwords``)."""

    def to_representation(self, value: Any) -> Any:
        return super().to_representation(passwords.hidden(value))


class ConfigVersionSerializer(serializers.ModelSerializer):
    created_by = UsernameField(allow_null=True)
    document = DocumentField(
        read_only=True,
        help_text="the complete document (docs/protocol.md); users' password hashes are "
        "write-only and left out",
    )
    current = serializers.SerializerMethodField(help_text="the version brokers should run")
    unset = serializers.SerializerMethodField(
        help_text="keys the document leaves out, each with the default that then applies"
    )

    class Meta:
        model = ConfigVersion
        fields = [
            "number",
            "checksum",
            "comment",
            "document",
            "unset",
            "current",
            "created_by",
            "created_at",
            "pushed_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField())
    def get_current(self, version: ConfigVersion) -> bool:
        if "_current" not in self.context:
            latest = configs.current()
            self.context["_current"] = latest.pk if latest else None
        return version.pk == self.context["_current"]

    @extend_schema_field(UnsetKeySerializer(many=True))
    def get_unset(self, version: ConfigVersion) -> list[dict[str, str]]:
        return convergence.unset_keys(version.document)


class ConfigVersionDetailSerializer(ConfigVersionSerializer):
    """A version with what every broker reports running."""

    convergence = serializers.SerializerMethodField()
    converged = serializers.SerializerMethodField(
        help_text="every known broker reports running this version"
    )
    convergence_summary = serializers.SerializerMethodField(help_text="the same, in words")

    class Meta(ConfigVersionSerializer.Meta):
        fields = [
            *ConfigVersionSerializer.Meta.fields,
            "converged",
            "convergence_summary",
            "convergence",
        ]
        read_only_fields = fields

    @extend_schema_field(ConvergenceSerializer(many=True))
    def get_convergence(self, version: ConfigVersion) -> list[dict[str, Any]]:
        return ConvergenceSerializer(
            [
                {
                    **row,
                    "differences": [
                        {k: d[k] for k in ("key", "status", "version", "broker", "source")}
                        for d in row["in_force"]["differences"]
                    ]
                    if row["in_force"]["reported"]
                    else None,
                }
                for row in self._rows(version)
            ],
            many=True,
        ).data

    @extend_schema_field(serializers.BooleanField())
    def get_converged(self, version: ConfigVersion) -> bool:
        return convergence.converged(self._rows(version))

    @extend_schema_field(serializers.CharField())
    def get_convergence_summary(self, version: ConfigVersion) -> str:
        return convergence.summary(self._rows(version))

    def _rows(self, version: ConfigVersion) -> list[dict[str, Any]]:
        """``convergence.broker_rows`` once per serialization."""
        cache = self.context.setdefault("_convergence", {})
        if version.pk not in cache:
            cache[version.pk] = convergence.broker_rows(version, configs.current())
        return cache[version.pk]


class ConfigSavedSerializer(ConfigVersionDetailSerializer):
    """The version a save or push ended on."""

    outcome = serializers.SerializerMethodField(
        help_text="created: a new version; unchanged: the document is the current version, "
        "nothing was pushed; repushed: an existing version was pushed again"
    )

    class Meta(ConfigVersionDetailSerializer.Meta):
        fields = ["outcome", *ConfigVersionDetailSerializer.Meta.fields]
        read_only_fields = fields

    @extend_schema_field(
        serializers.ChoiceField(choices=[configs.CREATED, configs.UNCHANGED, configs.REPUSHED])
    )
    def get_outcome(self, version: ConfigVersion) -> str:
        return self.context.get("outcome", configs.CREATED)


class ConfigCreateSerializer(StrictSerializer):
    document = serializers.DictField(
        required=False,
        help_text="the complete new document (docs/protocol.md); a key left out means each "
        "broker's own setting (see the version's 'unset')",
    )
    changes = serializers.DictField(
        required=False,
        help_text="instead of document: top-level keys to set on the current version's "
        "document (a key given as null is removed)",
    )
    base = StrictIntegerField(
        required=False,
        min_value=1,
        help_text="the version your edit started from; 409 if it is no longer current",
    )
    comment = StrictCharField(max_length=500, required=False, allow_blank=True, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("document" in attrs) == ("changes" in attrs):
            raise serializers.ValidationError("give either 'document' or 'changes'")
        return attrs


class ConfigPushSerializer(StrictSerializer):
    comment = StrictCharField(max_length=500, required=False, allow_blank=True, default="")


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = ["id", "time", "username", "action", "target", "details"]
        read_only_fields = fields


class BrokerEventSerializer(BrokerRowSerializer):
    class Meta:
        model = BrokerEvent
        fields = ["id", "broker", "broker_id", "time", "kind", "level", "message", "details"]
        read_only_fields = fields


class AlarmSerializer(BrokerRowSerializer):
    broker = BrokerNameField(allow_null=True)
    acknowledged_by = serializers.CharField(
        source="acknowledged_by_name",
        read_only=True,
        help_text="who acknowledged it (empty: nobody yet)",
    )

    class Meta:
        model = Alarm
        fields = [
            *BrokerRowSerializer.FIELDS,
            "kind",
            "message",
            "source",
            "active",
            "raised_at",
            "cleared_at",
            "updated_at",
            "acknowledged_at",
            "acknowledged_by",
            "acknowledgement",
        ]
        read_only_fields = fields


class AlarmAckSerializer(StrictSerializer):
    comment = StrictCharField(
        max_length=500, required=False, allow_blank=True, default="", help_text="a note"
    )


class EndpointSerializer(serializers.Serializer):
    broker = serializers.CharField(help_text="broker name")
    broker_type = serializers.CharField()
    address = serializers.CharField(help_text="host:port clients connect to")
    url = serializers.CharField(help_text="AMQP URL of the default vhost")
    is_root = serializers.BooleanField()


class ApiLinkSerializer(serializers.Serializer):
    name = serializers.CharField()
    url = serializers.CharField()
    description = serializers.CharField()


class ApiRootSerializer(serializers.Serializer):
    endpoints = ApiLinkSerializer(many=True)
    schema = serializers.CharField(help_text="the OpenAPI schema")
    docs = serializers.CharField(help_text="the interactive documentation page")


class TokenRequestSerializer(StrictSerializer, AuthTokenSerializer):
    """DRF's username/password check, refusing unknown fields like every other body."""


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="send as `Authorization: Token <your-token>`")
