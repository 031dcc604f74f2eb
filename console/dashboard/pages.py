"""The dashboard's pages: the fragments each shows and the context they are rendered with.

Views render a page's full template with :meth:`Page.context`; the live consumer
renders the page's fragments with the same context whenever the cluster changes.
Contexts depend only on the query parameters (filters, page number, broker), so
the websocket URL of a page carries them and a live update shows exactly what a
reload would.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import QueryDict
from django.utils import timezone

from clusterapi import cluster, configs
from clusterapi.api import filters
from clusterapi.models import (
    Alarm,
    AuditEntry,
    BindingSnapshot,
    Broker,
    Command,
    ConfigApplication,
    ConfigVersion,
    ExchangeSnapshot,
    QueueSnapshot,
)
from console.dashboard.charts import latest_message_rates
from console.dashboard.forms import pretty

LIVE_PATH = "/ws/dashboard/"
PAGE_SIZE = 50
#: per broker page: at most this many queues, exchanges and bindings listed
BROKER_OBJECTS_SHOWN = 200


# -- times: relative text, absolute time on hover ---------------------------------------


@dataclass(frozen=True)
class Stamp:
    """A time as pages show it (``templates/dashboard/when.html``)."""

    iso: str
    absolute: str
    relative: str


def relative(delta: dt.timedelta) -> str:
    """``"12 s ago"``, ``"3 min ago"``, ``"in 5 s"`` (static/dashboard.js keeps it ticking)."""
    seconds = delta.total_seconds()
    future, span = seconds < 0, abs(seconds)
    if span < 1:
        return "just now"
    if span < 60:
        text = f"{int(span)} s"
    elif span < 3600:
        text = f"{int(span // 60)} min"
    elif span < 86400:
        text = f"{int(span // 3600)} h"
    else:
        text = f"{int(span // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


def stamp(value: dt.datetime | None, now: dt.datetime | None = None) -> Stamp | None:
    if value is None:
        return None
    now = now or timezone.now()
    return Stamp(
        iso=value.isoformat(),
        absolute=value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative=relative(now - value),
    )


def with_stamps(objects: Iterable[Any], *fields: str) -> list[Any]:
    """The objects as a list, each with ``<field>_stamp`` set for every field."""
    now = timezone.now()
    out = list(objects)
    for obj in out:
        for name in fields:
            setattr(obj, f"{name}_stamp", stamp(getattr(obj, name), now))
    return out


# -- pages ------------------------------------------------------------------------------


Builder = Callable[[QueryDict], dict[str, Any]]


@dataclass(frozen=True)
class Page:
    """One dashboard page: its full template, its live fragments, its context."""

    name: str
    template: str
    fragments: tuple[str, ...]
    build: Builder
    #: the heading of a :func:`table_page` (other templates write their own)
    title: str = ""

    def context(self, params: QueryDict) -> dict[str, Any]:
        """Everything the page's template and fragments need (the cluster bar included)."""
        context = {"cluster": cluster_bar(), "page": self.name, "params": params}
        if self.title:
            context.update(title=self.title, table=self.fragments[-1])
        context.update(self.build(params))
        context["live_url"] = live_url(self.name, params)
        return context


def live_url(page: str, params: QueryDict) -> str:
    """The websocket URL of a page showing ``params``."""
    query = [("page", page)]
    query += [(key, value) for key, values in params.lists() for value in values if key != "page"]
    return f"{LIVE_PATH}?{urlencode(query)}"


def cluster_bar() -> dict[str, Any]:
    """The cluster's state for the bar every page shows (root, ready, quorum, alarms)."""
    return cluster.state()


def _fragments(*names: str) -> tuple[str, ...]:
    """The cluster bar (on every page), then the page's own fragments."""
    own = (f"dashboard/fragments/{name}.html" for name in names)
    return ("dashboard/fragments/cluster_bar.html", *own)


def table_page(name: str, title: str, table: str, build: Builder) -> Page:
    """A list page: its title, the filters and one live table (``table_page.html``)."""
    return Page(name, "dashboard/table_page.html", _fragments(table), build, title)


def _paginate(queryset: QuerySet, params: QueryDict, *stamps: str) -> dict[str, Any]:
    """One page of ``queryset`` (``?p=N``, clamped), with the query string of the others."""
    paginator = Paginator(queryset, PAGE_SIZE)
    page = paginator.get_page(params.get("p"))
    rest = params.copy()
    rest.pop("p", None)
    return {
        "rows": with_stamps(page.object_list, *stamps),
        "page_obj": page,
        "page_query": rest.urlencode(),
    }


def _filtered(
    filterset_class: type, params: QueryDict, queryset: QuerySet, shown: tuple[str, ...]
) -> dict[str, Any]:
    """The API's filter set over ``queryset`` (same semantics as the REST lists); bad
    values show as form errors and list nothing."""
    filterset = filterset_class(params, queryset=queryset)
    valid = filterset.is_valid()
    return {
        "filter_form": filterset.form,
        "filter_fields": [filterset.form[name] for name in shown],
        "filter_errors": None if valid else filterset.form.errors,
        "queryset": filterset.qs if valid else queryset.none(),
    }


def build_overview(params: QueryDict) -> dict[str, Any]:
    return {
        "brokers": with_stamps(Broker.objects.order_by("name"), "last_seen"),
        "alarms": with_stamps(
            Alarm.objects.filter(active=True).select_related("broker")[:20], "raised_at"
        ),
        "rates": latest_message_rates(),
        "commands": with_stamps(Command.objects.select_related("broker")[:5], "created_at"),
    }


def build_brokers(params: QueryDict) -> dict[str, Any]:
    return {"brokers": with_stamps(Broker.objects.order_by("name"), "last_seen", "start_time")}


def peer_links(broker: Broker) -> list[dict[str, Any]]:
    """The broker's peer links from its last status, named as the console knows them."""
    names = dict(Broker.objects.exclude(spid="").values_list("spid", "name"))
    out = []
    for peer in broker.view.get("peers") or []:
        if not isinstance(peer, dict):
            continue
        spid = str(peer.get("spid") or "")
        rtt = peer.get("rtt_ms")
        age = peer.get("last_seen_age")
        out.append(
            {
                "spid": spid,
                "name": names.get(spid, ""),
                "type": str(peer.get("type") or ""),
                "address": str(peer.get("address") or ""),
                "active": bool(peer.get("active")),
                "link": str(peer.get("link") or ""),
                "rtt_ms": rtt if isinstance(rtt, int | float) else None,
                "last_seen_age": age if isinstance(age, int | float) else None,
            }
        )
    return out


def build_broker(params: QueryDict) -> dict[str, Any]:
    broker = Broker.objects.filter(name=params.get("broker", "")).first()
    if broker is None:
        return {"broker": None}
    [broker] = with_stamps([broker], "last_seen", "start_time")
    dump = (
        broker.commands.filter(name=Command.STATE_DUMP, state=Command.STATE_ACKED)
        .order_by("-finished_at")
        .first()
    )
    return {
        "broker": broker,
        "peers": peer_links(broker),
        "queues": list(broker.queues.all()[:BROKER_OBJECTS_SHOWN]),
        "queue_count": broker.queues.count(),
        "exchanges": list(broker.exchanges.all()[:BROKER_OBJECTS_SHOWN]),
        "exchange_count": broker.exchanges.count(),
        "bindings": list(broker.bindings.all()[:BROKER_OBJECTS_SHOWN]),
        "binding_count": broker.bindings.count(),
        "commands": with_stamps(broker.commands.all()[:10], "created_at", "finished_at"),
        "dump": with_stamps([dump], "finished_at")[0] if dump else None,
        "dump_text": (dump.result or {}).get("dump", "") if dump else "",
        "alarms": with_stamps(broker.alarms.filter(active=True), "raised_at"),
        "live_broker": broker.name,
    }


def _list_page(
    filterset_class: type, queryset: QuerySet, shown: tuple[str, ...], *stamps: str
) -> Builder:
    """A list page's builder: the filter form, one page of what it selects and the total."""

    def build(params: QueryDict) -> dict[str, Any]:
        context = _filtered(filterset_class, params, queryset, shown)
        context.update(_paginate(context.pop("queryset"), params, *stamps))
        context["total"] = context["page_obj"].paginator.count  # counted once, by the pager
        return context

    return build


build_queues = _list_page(
    filters.QueueFilter,
    QueueSnapshot.objects.select_related("broker"),
    ("broker", "vhost", "name_contains", "min_messages", "shared"),
)
build_exchanges = _list_page(
    filters.ExchangeFilter,
    ExchangeSnapshot.objects.select_related("broker"),
    ("broker", "vhost", "name_contains", "type"),
)
build_bindings = _list_page(
    filters.BindingFilter,
    BindingSnapshot.objects.select_related("broker"),
    ("broker", "vhost", "source", "destination", "routing_key"),
)


def build_config(params: QueryDict) -> dict[str, Any]:
    version = configs.current()
    versions = list(ConfigVersion.objects.select_related("created_by")[:20])
    acked: dict[int, int] = {}
    for version_id in ConfigApplication.objects.filter(
        state=ConfigApplication.STATE_ACKED, version__in=versions
    ).values_list("version_id", flat=True):
        acked[version_id] = acked.get(version_id, 0) + 1
    for item in versions:
        item.acked_count = acked.get(item.pk, 0)
    convergence = configs.convergence(version) if version is not None else []
    return {
        "version": version,
        "convergence": convergence,
        "converged": bool(convergence) and all(c["state"] == "acked" for c in convergence),
        "versions": with_stamps(versions, "created_at"),
        "current_text": pretty(version.document) if version is not None else "",
        "broker_total": Broker.objects.count(),
    }


build_commands = _list_page(
    filters.CommandFilter,
    Command.objects.select_related("broker", "created_by"),
    ("broker", "name", "state"),
    "created_at",
    "finished_at",
)
build_audit = _list_page(
    filters.AuditFilter, AuditEntry.objects.all(), ("user", "action_prefix", "target"), "time"
)
_build_alarm_list = _list_page(
    filters.AlarmFilter,
    Alarm.objects.select_related("broker"),
    ("broker", "kind", "source", "active"),
    "raised_at",
    "cleared_at",
)


def build_alarms(params: QueryDict) -> dict[str, Any]:
    context = _build_alarm_list(params)
    context["active_alarms"] = with_stamps(
        Alarm.objects.filter(active=True).select_related("broker"), "raised_at"
    )
    return context


PAGES: dict[str, Page] = {
    page.name: page
    for page in (
        Page(
            "overview",
            "dashboard/overview.html",
            _fragments("cluster_state", "broker_table", "active_alarms", "rate_data", "recent"),
            build_overview,
        ),
        Page("brokers", "dashboard/brokers.html", _fragments("broker_table"), build_brokers),
        Page(
            "broker",
            "dashboard/broker.html",
            _fragments("broker_summary", "peer_links", "broker_objects", "broker_commands"),
            build_broker,
        ),
        table_page("queues", "Queues", "queue_table", build_queues),
        table_page("exchanges", "Exchanges", "exchange_table", build_exchanges),
        table_page("bindings", "Bindings", "binding_table", build_bindings),
        Page(
            "config",
            "dashboard/config.html",
            _fragments("convergence", "config_versions"),
            build_config,
        ),
        table_page("commands", "Commands", "command_table", build_commands),
        table_page("audit", "Audit log", "audit_table", build_audit),
        Page("alarms", "dashboard/alarms.html", _fragments("alarm_table"), build_alarms),
    )
}
