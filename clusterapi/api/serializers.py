"""JSON shapes of the API. Field names follow ``clusterapi.models`` (a contract)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.authtoken.serializers import AuthTokenSerializer

from clusterapi import configs, convergence, objects
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
    BindingSnapshot,
    Broker,
    Command,
    ConfigVersion,
    ExchangeSnapshot,
    HeartbeatSample,
    QueueSample,
    QueueSnapshot,
)

__all__ = ["ErrorSerializer"]  # re-exported: the API's views import it from here too


class RootRefSerializer(serializers.Serializer):
    name = serializers.CharField()
    spid = serializers.CharField()


class ClusterStateSerializer(serializers.Serializer):
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
        "queues it masters (the root); `counts.queues` also counts its proxies",
    )

    class Meta:
        model = Broker
        fields = [
            "id",
            "name",
            "spid",
            "address",
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
            "queues_held",
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


class ConsumerServerSerializer(serializers.Serializer):
    broker = serializers.CharField(
        allow_null=True, help_text="broker name (null: a server not linked to the console)"
    )
    spid = serializers.CharField(help_text="the server's process id in this run")
    consumers = serializers.IntegerField(help_text="consumers connected to it")


class QueueSerializer(BrokerRowSerializer):
    consumer_servers = serializers.SerializerMethodField(
        help_text="where the queue's consumers are connected, per broker: a shared queue as "
        "its master counts them, a private queue's all on its broker (empty when master is "
        "false: not known)"
    )

    class Meta:
        model = QueueSnapshot
        fields = [
            *BrokerRowSerializer.FIELDS,
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
            "enqueued",
            "delivered",
            "arguments",
            "updated_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "broker": {
                "help_text": "the broker that reported this row; in the list, the one holding "
                "the queue's messages (a shared queue's master, the root)"
            },
            "master": {
                "help_text": "the broker holds the queue's messages: true for a private queue "
                "and a shared queue's master; false for a proxy, whose messages (0 here) are "
                "on the root. The list shows a shared queue with master false only while no "
                "broker reports mastering it: its depth is then not known"
            },
            "consumers": {
                "help_text": "consumers of the queue (a shared queue's master counts those of "
                "every server; a proxy, the ones connected to it)"
            },
            "local_consumers": {"help_text": "consumers connected to the row's broker"},
        }

    def _names(self) -> dict[str, str]:
        if "_spid_names" not in self.context:
            self.context["_spid_names"] = objects.spid_names()
        return self.context["_spid_names"]

    @extend_schema_field(ConsumerServerSerializer(many=True))
    def get_consumer_servers(self, queue: QueueSnapshot) -> list[dict[str, Any]]:
        return objects.consumer_spread(queue, self._names())


class QueueCopySerializer(BrokerRowSerializer):
    state = serializers.CharField(source="broker.state", help_text="the broker's state")

    class Meta:
        model = QueueSnapshot
        fields = [
            *BrokerRowSerializer.FIELDS,
            "state",
            "master",
            "messages",
            "unacked",
            "consumers",
            "local_consumers",
            "updated_at",
        ]
        read_only_fields = fields


class QueueDetailSerializer(QueueSerializer):
    per_broker = serializers.SerializerMethodField(
        help_text="what each broker that has the queue reports: a shared queue's master and "
        "its proxies (one per server), a private queue's own row"
    )

    class Meta(QueueSerializer.Meta):
        fields = [*QueueSerializer.Meta.fields, "per_broker"]
        read_only_fields = fields

    @extend_schema_field(QueueCopySerializer(many=True))
    def get_per_broker(self, queue: QueueSnapshot) -> list[dict[str, Any]]:
        return QueueCopySerializer(objects.per_broker(queue), many=True).data


class WiringCopySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    broker = serializers.CharField(source="broker.name")
    broker_id = serializers.IntegerField()
    state = serializers.CharField(source="broker.state", help_text="the broker's state")
    updated_at = serializers.DateTimeField()


# Exchanges and bindings: ``shared`` wiring is the same on every server of the cluster.
class WiringSerializer(BrokerRowSerializer):
    servers = serializers.IntegerField(
        read_only=True, help_text="how many brokers have it (a private binding: 1)"
    )

    #: the fields every exchange and binding adds to the row's own
    FIELDS = ["shared", "servers"]
    EXTRA = {
        "broker": {
            "help_text": "the broker that reported this row; in the list, for a shared "
            "exchange or binding, the root's copy when the root has it"
        },
        "shared": {"help_text": "cluster wiring: the same on every server of the cluster"},
    }

    @extend_schema_field(WiringCopySerializer(many=True))
    def get_per_broker(self, row: Any) -> list[dict[str, Any]]:
        return WiringCopySerializer(objects.per_broker(row), many=True).data


class ExchangeSerializer(WiringSerializer):
    class Meta:
        model = ExchangeSnapshot
        fields = [
            *BrokerRowSerializer.FIELDS,
            "vhost",
            "name",
            "type",
            "durable",
            "auto_delete",
            "internal",
            *WiringSerializer.FIELDS,
            "arguments",
            "updated_at",
        ]
        read_only_fields = fields
        extra_kwargs = WiringSerializer.EXTRA


class ExchangeDetailSerializer(ExchangeSerializer):
    per_broker = serializers.SerializerMethodField(
        help_text="every broker that has the exchange, with when it last reported a change"
    )

    class Meta(ExchangeSerializer.Meta):
        fields = [*ExchangeSerializer.Meta.fields, "per_broker"]
        read_only_fields = fields


class BindingSerializer(WiringSerializer):
    class Meta:
        model = BindingSnapshot
        fields = [
            *BrokerRowSerializer.FIELDS,
            "vhost",
            "source",
            "destination",
            "destination_type",
            "routing_key",
            *WiringSerializer.FIELDS,
            "arguments",
            "updated_at",
        ]
        read_only_fields = fields
        extra_kwargs = WiringSerializer.EXTRA


class BindingDetailSerializer(BindingSerializer):
    per_broker = serializers.SerializerMethodField(
        help_text="every broker that has the binding, with when it last reported a change"
    )

    class Meta(BindingSerializer.Meta):
        fields = [*BindingSerializer.Meta.fields, "per_broker"]
        read_only_fields = fields


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
        fields = [
            *BrokerRowSerializer.FIELDS,
            "time",
            "vhost",
            "queue",
            "messages",
            "unacked",
            "consumers",
            "enqueued_total",
            "delivered_total",
            "rate_in",
            "rate_out",
        ]
        read_only_fields = fields


class UsernameField(serializers.SlugRelatedField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        super().__init__(slug_field="username", **kwargs)


class CommandSerializer(BrokerRowSerializer):
    created_by = UsernameField(allow_null=True)

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


class UnsetKeySerializer(serializers.Serializer):
    key = serializers.CharField()
    default = serializers.CharField(help_text="what the key's absence means on the brokers")


class ConfigVersionSerializer(serializers.ModelSerializer):
    created_by = UsernameField(allow_null=True)
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
        return self._rows(version)

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
    token = serializers.CharField(help_text="send as 'Authorization: Token <token>'")
