"""JSON shapes of the cluster-wide queues, exchanges and bindings (``clusterapi.objects``).

A list item is one object of the cluster (a shared one once); a detail adds
``per_broker``, what every broker that has the object reports. Field names
follow ``clusterapi.models`` (a contract).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from clusterapi import objects
from clusterapi.api.serializers import BrokerRowSerializer
from clusterapi.models import BindingSnapshot, ExchangeSnapshot, QueueSnapshot


class ConsumerServerSerializer(serializers.Serializer):
    broker = serializers.CharField(
        allow_null=True, help_text="broker name (null: a server not linked to the console)"
    )
    spid = serializers.CharField(help_text="the server's process id in this run")
    consumers = serializers.IntegerField(help_text="consumers connected to it")


class ReplicaSerializer(serializers.Serializer):
    broker = serializers.CharField(
        allow_null=True, help_text="broker name (null: a server not linked to the console)"
    )
    spid = serializers.CharField(help_text="the server's process id in this run")
    in_sync = serializers.BooleanField(
        help_text="its copy holds every message of the queue (a synchronised mirror, as "
        "RabbitMQ says); false while its snapshot is still being sent, or it has stalled"
    )
    behind = serializers.IntegerField(
        min_value=0, help_text="replication events of the root it has not acknowledged yet"
    )


class QueueSerializer(BrokerRowSerializer):
    type = serializers.ChoiceField(
        source="kind",
        choices=QueueSnapshot.KINDS,
        read_only=True,
        help_text="how the cluster keeps the queue: classic (a private queue, or a shared one "
        "on its owner alone, as x-queue-type classic asks), quorum, or replicated (a shared "
        "queue declared without a type: on its owner, copied to every other primary)",
    )
    consumer_servers = serializers.SerializerMethodField(
        help_text="where the queue's consumers are connected, per broker: a shared queue as "
        "its master counts them, a private queue's all on its broker (empty when master is "
        "false: not known)"
    )

    replicas = serializers.SerializerMethodField(
        help_text="the servers holding a copy of a replicated or quorum queue, as its master "
        "reports them, each in sync or not (empty for a classic or private queue, a root "
        "alone, and when master is false: not known)"
    )

    class Meta:
        model = QueueSnapshot
        fields = [
            *BrokerRowSerializer.FIELDS,
            *("type" if name == "queue_type" else name for name in QueueSnapshot.REPORTED),
            "updated_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "broker": {
                "help_text": "the broker that reported this row; in the list, the one holding "
                "the queue's messages (a shared queue's master: its owner)"
            },
            "master": {
                "help_text": "the broker holds the queue's messages: true for a private queue "
                "and a shared queue's master; false for a proxy, whose messages (0 here) are "
                "on the queue's owner. The list shows a shared queue with master false only "
                "while no broker reports mastering it: its depth is then not known"
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

    @extend_schema_field(ReplicaSerializer(many=True))
    def get_replicas(self, queue: QueueSnapshot) -> list[dict[str, Any]]:
        return objects.replica_set(queue, self._names())


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
