"""Query filters of the API's lists (django-filter), documented in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db import models
from django.db.models import Q, QuerySet
from django_filters import rest_framework as filters
from django_filters.rest_framework.filterset import FILTER_FOR_DBFIELD_DEFAULTS
from django_filters.widgets import BooleanWidget

from clusterapi import objects
from clusterapi.models import (
    Alarm,
    AuditEntry,
    BindingSnapshot,
    Broker,
    BrokerEvent,
    Command,
    ConfigVersion,
    ExchangeSnapshot,
    HeartbeatSample,
    QueueSample,
    QueueSnapshot,
)
from clusterapi.objects import broker_pk

__all__ = ["broker_pk"]  # re-exported: the views look brokers up by id or name with it


#: the empty choice of a select filter: it filters nothing, so it means "any", not
#: django-filter's "Unknown" (yes/no filters) or "---------" (choices)
ANY = "Any"


class AnyBooleanWidget(BooleanWidget):
    """A yes/no filter's select with "Any" for its empty choice (values as before:
    ``true``/``false``, ``1``/``0``)."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs)
        self.choices = [("", ANY), ("true", "Yes"), ("false", "No")]


class AnyBooleanFilter(filters.BooleanFilter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("widget", AnyBooleanWidget)
        super().__init__(*args, **kwargs)


class AnyChoiceFilter(filters.ChoiceFilter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("empty_label", ANY)
        super().__init__(*args, **kwargs)


class FilterSet(filters.FilterSet):
    """The API's filter sets (and the dashboard's filter forms): a select's empty choice
    says "Any"."""

    FILTER_DEFAULTS = {
        **FILTER_FOR_DBFIELD_DEFAULTS,
        models.BooleanField: {"filter_class": AnyBooleanFilter},
    }

    @classmethod
    def filter_for_lookup(cls, field: models.Field, lookup_type: str) -> tuple[type, dict]:
        filter_class, params = super().filter_for_lookup(field, lookup_type)
        if filter_class is not None and issubclass(filter_class, filters.ChoiceFilter):
            params.setdefault("empty_label", ANY)
        return filter_class, params


class BrokerRefFilter(filters.CharFilter):
    """A broker given by its id or its name (``host:port``)."""

    def __init__(self, field_name: str = "broker", **kwargs: object) -> None:
        kwargs.setdefault("help_text", "broker id or name (host:port)")
        super().__init__(field_name=field_name, **kwargs)

    def filter(self, qs: QuerySet, value: str) -> QuerySet:
        if value in (None, ""):
            return qs
        by_name = Q(**{f"{self.field_name}__name": value})
        broker_id = broker_pk(value)
        if broker_id is not None:
            return qs.filter(by_name | Q(**{f"{self.field_name}_id": broker_id}))
        return qs.filter(by_name)


class IntegerFilter(filters.NumberFilter):
    """A whole number (NumberFilter takes decimals, which a count never is)."""

    field_class = forms.IntegerField


def since_until(field: str = "time") -> tuple[filters.IsoDateTimeFilter, filters.IsoDateTimeFilter]:
    return (
        filters.IsoDateTimeFilter(
            field_name=field, lookup_expr="gte", help_text="ISO 8601 time, inclusive"
        ),
        filters.IsoDateTimeFilter(
            field_name=field, lookup_expr="lt", help_text="ISO 8601 time, exclusive"
        ),
    )


class BrokerFilter(FilterSet):
    type = AnyChoiceFilter(field_name="broker_type", choices=Broker.TYPE_CHOICES)
    state = AnyChoiceFilter(choices=Broker.STATE_CHOICES)
    name_contains = filters.CharFilter(field_name="name", lookup_expr="icontains")

    class Meta:
        model = Broker
        fields = ["type", "state", "is_root", "root_enabled", "ready", "connected", "name"]


class ReportedByFilter(BrokerRefFilter):
    """Exchanges or bindings a broker has: its private ones and every shared one it holds
    a copy of (``objects.reported_by``), whichever broker's row the list shows."""

    def filter(self, qs: QuerySet, value: str) -> QuerySet:
        return qs if value in (None, "") else objects.reported_by(qs, value)


class ConsumersOnFilter(BrokerRefFilter):
    """Queues with consumers connected to a broker (``objects.consumers_on``)."""

    def filter(self, qs: QuerySet, value: str) -> QuerySet:
        return qs if value in (None, "") else objects.consumers_on(qs, value)


class QueueFilter(FilterSet):
    broker = BrokerRefFilter(
        label="Held by",
        help_text="broker id or name (host:port) holding the queue's messages: a shared "
        "queue matches the broker that masters it (the root), not the brokers it has "
        "consumers on (see consumers_on)",
    )
    consumers_on = ConsumersOnFilter(
        field_name="broker",
        label="Consumers on",
        help_text="broker id or name (host:port): queues with consumers connected to that "
        "broker, as it reports them (shared queues it has consumers on, and its own)",
    )
    name_contains = filters.CharFilter(field_name="name", lookup_expr="icontains")
    min_messages = IntegerFilter(field_name="messages", lookup_expr="gte")

    class Meta:
        model = QueueSnapshot
        fields = [
            "broker",
            "consumers_on",
            "vhost",
            "name",
            "shared",
            "durable",
            "exclusive",
            "auto_delete",
        ]


class ExchangeFilter(FilterSet):
    broker = ReportedByFilter(
        label="On broker",
        help_text="broker id or name (host:port) that has the exchange: its own, and every "
        "shared exchange (the cluster's wiring is on every server)",
    )
    name_contains = filters.CharFilter(field_name="name", lookup_expr="icontains")

    class Meta:
        model = ExchangeSnapshot
        fields = ["broker", "vhost", "name", "type", "durable", "internal", "shared"]


class BindingFilter(FilterSet):
    broker = ReportedByFilter(
        label="On broker",
        help_text="broker id or name (host:port) that has the binding: its private queues' "
        "bindings, and every shared one",
    )

    class Meta:
        model = BindingSnapshot
        fields = [
            "broker",
            "vhost",
            "source",
            "destination",
            "destination_type",
            "routing_key",
            "shared",
        ]


class HeartbeatFilter(FilterSet):
    broker = BrokerRefFilter()
    since, until = since_until()

    class Meta:
        model = HeartbeatSample
        fields = ["broker", "since", "until", "is_root", "ready"]


class QueueSampleFilter(FilterSet):
    broker = BrokerRefFilter()
    since, until = since_until()

    class Meta:
        model = QueueSample
        fields = ["broker", "vhost", "queue", "since", "until"]


class ConfigVersionFilter(FilterSet):
    since, until = since_until("created_at")

    class Meta:
        model = ConfigVersion
        fields = ["since", "until"]


class CommandFilter(FilterSet):
    broker = BrokerRefFilter()
    state = AnyChoiceFilter(choices=Command.STATE_CHOICES)
    name = AnyChoiceFilter(choices=Command.NAME_CHOICES)
    since, until = since_until("created_at")

    class Meta:
        model = Command
        fields = ["broker", "state", "name", "since", "until"]


class AuditFilter(FilterSet):
    user = filters.CharFilter(field_name="username", help_text="user name")
    action_prefix = filters.CharFilter(field_name="action", lookup_expr="startswith")
    since, until = since_until()

    class Meta:
        model = AuditEntry
        fields = ["user", "action", "action_prefix", "target", "since", "until"]


class EventFilter(FilterSet):
    broker = BrokerRefFilter()
    kind = AnyChoiceFilter(choices=BrokerEvent.KIND_CHOICES)
    level = AnyChoiceFilter(choices=BrokerEvent.LEVEL_CHOICES)
    since, until = since_until()

    class Meta:
        model = BrokerEvent
        fields = ["broker", "kind", "level", "since", "until"]


class AlarmFilter(FilterSet):
    broker = BrokerRefFilter()
    source = AnyChoiceFilter(choices=Alarm.SOURCE_CHOICES)
    since, until = since_until("raised_at")

    class Meta:
        model = Alarm
        fields = ["broker", "active", "kind", "source", "since", "until"]
