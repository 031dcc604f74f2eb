"""Admin pages for clusterapi's models.

What brokers report (brokers, samples, snapshots) and what the console records
(commands, configuration versions, applications, audit) is read-only here: those
change through the broker link and the service functions, which validate, audit
and deliver. Alarms can be browsed; they clear themselves.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from clusterapi import models, passwords


class ReadOnlyAdmin(admin.ModelAdmin):
    """Browse and search only: the data comes from brokers or from audited services."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PrunableAdmin(ReadOnlyAdmin):
    """Read-only, but a superuser may delete rows (e.g. a broker that is gone for good)."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser


class SampleAdmin(ReadOnlyAdmin):
    """Time series: kept by the retention task, never edited or deleted by hand."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.Broker)
class BrokerAdmin(PrunableAdmin):
    """Retiring (the broker page, or ``POST /api/v1/brokers/{id}/decommission/``) is the
    supported way to take a broker out; a superuser may then delete a retired one here,
    with everything it reported.

    Django's delete confirmation refuses when any cascaded row's admin denies deletion,
    and samples and snapshots are never deletable by hand (``SampleAdmin``): so deleting
    any broker was refused, even to the superuser. Here the rows that go with a retired
    broker do not need their own permission; a broker in service cannot be deleted.
    """

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.state != models.Broker.STATE_RETIRED:
            return False
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, ...]:
        _listed, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        in_service = [b.name for b in objs if b.state != models.Broker.STATE_RETIRED]
        if in_service:
            perms_needed = {f"brokers in service (retire them first: {', '.join(in_service)})"}
        else:
            perms_needed = set()
        # counts, not every sample (days of 1 Hz heartbeats would be one huge page)
        summary = [f"Broker: {b.name}" for b in objs]
        summary += [f"{count} {name}" for name, count in counts.items() if name != "brokers"]
        return summary, counts, perms_needed, protected

    list_display = (
        "name",
        "broker_type",
        "state",
        "connected",
        "is_root",
        "root_enabled",
        "ready",
        "config_version",
        "last_seen",
        "version",
    )
    list_filter = ("state", "connected", "broker_type", "is_root", "ready", "root_enabled")
    search_fields = ("name", "spid", "address", "cluster")
    ordering = ("name",)


@admin.register(models.HeartbeatSample)
class HeartbeatSampleAdmin(SampleAdmin):
    list_display = (
        "time",
        "broker",
        "connections",
        "consumers",
        "queues",
        "messages_ready",
        "messages_unacked",
        "rate_published",
        "rate_delivered",
        "is_root",
        "ready",
        "peers_active",
    )
    list_filter = ("broker", "is_root", "ready")
    date_hierarchy = "time"
    list_select_related = ("broker",)
    show_full_result_count = False


@admin.register(models.QueueSample)
class QueueSampleAdmin(SampleAdmin):
    list_display = (
        "time",
        "broker",
        "vhost",
        "queue",
        "messages",
        "unacked",
        "consumers",
        "rate_in",
        "rate_out",
    )
    list_filter = ("broker", "vhost")
    search_fields = ("queue",)
    date_hierarchy = "time"
    list_select_related = ("broker",)
    show_full_result_count = False


@admin.register(models.QueueSnapshot)
class QueueSnapshotAdmin(SampleAdmin):
    list_display = (
        "name",
        "vhost",
        "broker",
        "durable",
        "shared",
        "master",
        "messages",
        "unacked",
        "consumers",
        "updated_at",
    )
    list_filter = ("broker", "vhost", "durable", "shared", "master", "exclusive", "auto_delete")
    search_fields = ("name",)
    list_select_related = ("broker",)


@admin.register(models.ExchangeSnapshot)
class ExchangeSnapshotAdmin(SampleAdmin):
    list_display = (
        "name",
        "vhost",
        "type",
        "broker",
        "shared",
        "durable",
        "auto_delete",
        "internal",
    )
    list_filter = ("broker", "vhost", "type", "shared", "durable", "internal")
    search_fields = ("name",)
    list_select_related = ("broker",)


@admin.register(models.BindingSnapshot)
class BindingSnapshotAdmin(SampleAdmin):
    list_display = (
        "source",
        "destination",
        "destination_type",
        "routing_key",
        "vhost",
        "broker",
        "shared",
    )
    list_filter = ("broker", "vhost", "destination_type", "shared")
    search_fields = ("source", "destination", "routing_key")
    list_select_related = ("broker",)


class ConfigApplicationInline(admin.TabularInline):
    model = models.ConfigApplication
    fields = ("broker", "state", "checksum", "error", "updated_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.ConfigVersion)
class ConfigVersionAdmin(ReadOnlyAdmin):
    """New versions are saved through the API or dashboard, which validate and push them."""

    list_display = ("number", "checksum", "comment", "created_by", "created_at")
    search_fields = ("comment", "checksum")
    inlines = (ConfigApplicationInline,)
    exclude = ("document",)
    readonly_fields = ("shown_document",)

    @admin.display(description="document (users' password hashes are write-only)")
    def shown_document(self, version: models.ConfigVersion) -> str:
        return json.dumps(passwords.hidden(version.document), indent=2, sort_keys=True)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.ConfigApplication)
class ConfigApplicationAdmin(SampleAdmin):
    list_display = ("version", "broker", "state", "checksum", "error", "updated_at")
    list_filter = ("state", "broker", "version")
    list_select_related = ("version", "broker")


@admin.register(models.Command)
class CommandAdmin(SampleAdmin):
    list_display = (
        "created_at",
        "name",
        "broker",
        "state",
        "attempts",
        "created_by",
        "finished_at",
        "error",
    )
    list_filter = ("state", "name", "broker")
    search_fields = ("id", "error")
    date_hierarchy = "created_at"
    list_select_related = ("broker", "created_by")
    exclude = ("args",)
    readonly_fields = ("shown_args",)

    @admin.display(description="args (a configuration's password hashes are write-only)")
    def shown_args(self, command: models.Command) -> str:
        return json.dumps(passwords.hidden_args(command.name, command.args), indent=2)


@admin.register(models.AuditEntry)
class AuditEntryAdmin(SampleAdmin):
    list_display = ("time", "username", "action", "target")
    list_filter = ("action",)
    search_fields = ("username", "action", "target")
    date_hierarchy = "time"


@admin.register(models.Alarm)
class AlarmAdmin(PrunableAdmin):
    list_display = ("raised_at", "kind", "broker", "source", "active", "cleared_at", "message")
    list_filter = ("active", "source", "kind", "broker")
    search_fields = ("kind", "message")
    date_hierarchy = "raised_at"
    list_select_related = ("broker",)


@admin.register(models.ArchiveBatch)
class ArchiveBatchAdmin(SampleAdmin):
    """The archive's journal: which samples went into which lake files."""

    list_display = ("id", "kind", "broker", "first_id", "last_id", "rows", "cutoff", "done_at")
    list_filter = ("kind", "broker")
    list_select_related = ("broker",)


@admin.register(models.ReportRun)
class ReportRunAdmin(PrunableAdmin):
    """Runs are requested from the reports page or the API; a superuser may delete old ones
    (their files under REPORTS_DIR stay until removed by hand)."""

    list_display = ("id", "state", "trigger", "period_from", "period_to", "created_at")
    list_filter = ("state", "trigger")
    date_hierarchy = "created_at"


@admin.register(models.BrokerEvent)
class BrokerEventAdmin(SampleAdmin):
    list_display = ("time", "broker", "kind", "level", "message")
    list_filter = ("kind", "level", "broker")
    date_hierarchy = "time"
    list_select_related = ("broker",)
