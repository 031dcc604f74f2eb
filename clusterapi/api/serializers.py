"""JSON shapes of the API. Field names follow ``clusterapi.models`` (a contract)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from clusterapi import configs
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


class ErrorSerializer(serializers.Serializer):
    """Every error response: a message and DRF's structured detail."""

    error = serializers.CharField(help_text="what went wrong, for a person")
    detail = serializers.JSONField(allow_null=True, help_text="structured detail, e.g. per field")


class RootRefSerializer(serializers.Serializer):
    name = serializers.CharField()
    spid = serializers.CharField()


class ClusterStateSerializer(serializers.Serializer):
    root = RootRefSerializer(allow_null=True, help_text="the broker every member agrees on")
    ready = serializers.BooleanField()
    quorum = serializers.CharField(allow_blank=True)
    brokers_up = serializers.IntegerField()
    brokers_total = serializers.IntegerField()
    config_version = serializers.IntegerField(allow_null=True)
    alarms_active = serializers.IntegerField()


class BrokerSerializer(serializers.ModelSerializer):
    heartbeat_age = serializers.SerializerMethodField(
        help_text="seconds since the last hello or status (null: never heard)"
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


class QueueSerializer(BrokerRowSerializer):
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
            "messages",
            "unacked",
            "consumers",
            "enqueued",
            "delivered",
            "arguments",
            "updated_at",
        ]
        read_only_fields = fields


class ExchangeSerializer(BrokerRowSerializer):
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
            "arguments",
            "updated_at",
        ]
        read_only_fields = fields


class BindingSerializer(BrokerRowSerializer):
    class Meta:
        model = BindingSnapshot
        fields = [
            *BrokerRowSerializer.FIELDS,
            "vhost",
            "source",
            "destination",
            "destination_type",
            "routing_key",
            "arguments",
            "updated_at",
        ]
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


class RootRequestSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(
        help_text="true: the broker may be elected root; false: it steps down and abstains"
    )


class DumpRequestSerializer(serializers.Serializer):
    """No arguments: the dump text arrives in the command's ``result.dump`` once acked."""


class ConvergenceSerializer(serializers.Serializer):
    broker = serializers.CharField(help_text="broker name")
    state = serializers.CharField(help_text="pending, acked, failed (or absent)")
    checksum = serializers.CharField(allow_blank=True, allow_null=True)
    error = serializers.CharField(allow_blank=True, allow_null=True)


class ConfigVersionSerializer(serializers.ModelSerializer):
    created_by = UsernameField(allow_null=True)

    class Meta:
        model = ConfigVersion
        fields = ["number", "checksum", "comment", "document", "created_by", "created_at"]
        read_only_fields = fields


class ConfigVersionDetailSerializer(ConfigVersionSerializer):
    """A version with its application on every broker."""

    convergence = serializers.SerializerMethodField()
    converged = serializers.SerializerMethodField(
        help_text="every known broker acked this version with its checksum"
    )

    class Meta(ConfigVersionSerializer.Meta):
        fields = [*ConfigVersionSerializer.Meta.fields, "converged", "convergence"]
        read_only_fields = fields

    @extend_schema_field(ConvergenceSerializer(many=True))
    def get_convergence(self, version: ConfigVersion) -> list[dict[str, Any]]:
        return self._rows(version)

    @extend_schema_field(serializers.BooleanField())
    def get_converged(self, version: ConfigVersion) -> bool:
        rows = self._rows(version)
        return bool(rows) and all(
            row["state"] == "acked" and row["checksum"] == version.checksum for row in rows
        )

    def _rows(self, version: ConfigVersion) -> list[dict[str, Any]]:
        """``configs.convergence`` once per serialization, brokers shown by name."""
        cache = self.context.setdefault("_convergence", {})
        if version.pk not in cache:
            cache[version.pk] = [
                {
                    "broker": getattr(row["broker"], "name", row["broker"]),
                    "state": row.get("state") or "",
                    "checksum": row.get("checksum") or "",
                    "error": row.get("error") or "",
                }
                for row in configs.convergence(version)
            ]
        return cache[version.pk]


class ConfigCreateSerializer(serializers.Serializer):
    document = serializers.DictField(
        help_text="the cluster configuration document (docs/protocol.md); every key optional"
    )
    comment = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = ["id", "time", "username", "action", "target", "details"]
        read_only_fields = fields


class AlarmSerializer(BrokerRowSerializer):
    broker = BrokerNameField(allow_null=True)

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
        ]
        read_only_fields = fields


class EndpointSerializer(serializers.Serializer):
    broker = serializers.CharField(help_text="broker name")
    broker_type = serializers.CharField()
    address = serializers.CharField(help_text="host:port clients connect to")
    url = serializers.CharField(help_text="AMQP URL of the default vhost")
    is_root = serializers.BooleanField()
