"""The dashboard's pages: the fragments each shows and the context they are rendered with.

Views render a page's full template with :meth:`Page.context`; the live consumer
renders the page's fragments with the same context whenever the cluster changes.
Contexts depend only on the query parameters (filters, page number, broker), so
the websocket URL of a page carries them and a live update shows exactly what a
reload would.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import QueryDict
from django.utils import timezone

from clusterapi import (
    cluster,
    groups,
    members,
    objects,
    owners,
)
from clusterapi.api import filters
from clusterapi.errors import Conflict
from clusterapi.models import (
    Alarm,
    AuditEntry,
    BindingSnapshot,
    Broker,
    Command,
    ExchangeSnapshot,
    QueueSnapshot,
)
from console.dashboard.bridge_page import build_bridges
from console.dashboard.broker_page import BANNER_SECONDS, build_broker
from console.dashboard.charts import latest_message_rates
from console.dashboard.config_context import build_config
from console.dashboard.readable import detail_items, with_stamps
from console.dashboard.rows import grouped_by_host, with_spread

LIVE_PATH = "/ws/dashboard/"
PAGE_SIZE = 50


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
    brokers = grouped_by_host(with_stamps(objects.brokers(), "last_seen"))
    return {
        "brokers": brokers,
        "objects": {**objects.counts(), "messages_ready": objects.messages_ready(brokers)},
        "alarms": with_stamps(
            Alarm.objects.filter(active=True).select_related("broker")[:20],
            "raised_at",
            "acknowledged_at",
        ),
        "rates": latest_message_rates(),
        "commands": with_stamps(
            Command.objects.select_related("broker", "created_by")[:5], "created_at", "finished_at"
        ),
        "members": members_view(),
    }


def members_view() -> dict[str, Any]:
    """The overview's Members section: the members as the root reports them (or why
    they are not known), and the forgets, grows and shrinks on their way or just ended,
    which it follows live to their outcome (a refusal's text, each queue's answer)."""
    shown = members.shown()
    banner = with_stamps(members.recent_commands(), "created_at", "finished_at")
    for command in banner:
        if command.name in groups.ACTIONS.values():
            command.queue_answers = groups.outcome(command.result)  # type: ignore[attr-defined]
    shown["banner"] = banner
    return shown


def build_brokers(params: QueryDict) -> dict[str, Any]:
    return {"brokers": grouped_by_host(with_stamps(objects.brokers(), "last_seen", "start_time"))}


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


# The cluster-wide lists: each shared object once (clusterapi.objects), as the API lists them.
_build_queue_list = _list_page(
    filters.QueueFilter,
    objects.queues(),
    ("broker", "consumers_on", "vhost", "name_contains", "min_messages", "shared"),
)
build_exchanges = _list_page(
    filters.ExchangeFilter,
    objects.exchanges(),
    ("broker", "vhost", "name_contains", "type", "shared"),
)
build_bindings = _list_page(
    filters.BindingFilter,
    objects.bindings(),
    ("broker", "vhost", "source", "destination", "routing_key", "shared"),
)


def rebalance_view() -> dict[str, Any]:
    """The queue list's rebalance section: the vhosts holding shared queues (the ones a
    rebalance can spread), the primary that would be asked or why none can be, and
    the recent rebalances with the moves each ordered."""
    since = timezone.now() - dt.timedelta(seconds=BANNER_SECONDS)
    shared = QueueSnapshot.objects.filter(shared=True).order_by()  # (Meta's ordering: no DISTINCT)
    vhosts = sorted(shared.values_list("vhost", flat=True).distinct())
    try:
        owners.cluster_primary(None)
        refusal = "" if vhosts else "no shared queue is reported: there is nothing to spread"
    except Conflict as exc:
        refusal = exc.message
    names = objects.spid_names()
    banner = with_stamps(owners.recent_rebalances(since)[:3], "created_at", "finished_at")
    for command in banner:
        moves = (command.result or {}).get("moves") if isinstance(command.result, dict) else None
        command.moves = [
            {
                "queue": str(m.get("queue")),
                "from": names.get(str(m.get("from")), m.get("from")),
                "to": names.get(str(m.get("to")), m.get("to")),
            }
            for m in (moves if isinstance(moves, list) else [])
            if isinstance(m, dict)
        ]
    return {"vhosts": vhosts, "refusal": refusal, "banner": banner}


def build_queues(params: QueryDict) -> dict[str, Any]:
    context = _build_queue_list(params)
    context["rows"] = with_spread(context["rows"])
    context["actions"] = "dashboard/fragments/queue_rebalance.html"
    context["rebalance"] = rebalance_view()
    return context


# -- one queue, exchange or binding: what the cluster shows, and what each broker reports --


def _object(model: type, params: QueryDict) -> Any:
    """The row ``?id=`` names (any broker's), or None."""
    pk = objects.broker_pk(params.get("id", ""))  # ids are spelled like broker ids
    return model.objects.select_related("broker").filter(pk=pk).first() if pk else None


def _detail(kind: str, title: str, shown: Any) -> dict[str, Any]:
    """An object page's context: the object as the cluster list shows it, every broker's
    row of it, and the up brokers of its cluster that do not report a shared one (None:
    no such row, the view answers 404)."""
    rows = with_stamps(objects.per_broker(shown), "updated_at") if shown else []
    missing: list[str] = []
    if shown is not None and shown.shared and shown.broker.cluster:
        missing = list(
            Broker.objects.filter(state=Broker.STATE_UP, cluster=shown.broker.cluster)
            .exclude(pk__in=[r.broker_id for r in rows])
            .values_list("name", flat=True)
        )
    return {
        "object": shown,
        "title": title,
        "detail": f"dashboard/fragments/{kind}_detail.html",
        "per_broker": rows,
        "missing": missing,
    }


def queue_moves(queue: QueueSnapshot) -> dict[str, Any]:
    """The queue page's owner section: where the queue can move (or why it cannot:
    the API would answer 409 with the same words) and its recent moves, which the
    section follows live to their outcome."""
    since = timezone.now() - dt.timedelta(seconds=BANNER_SECONDS)
    names = objects.spid_names()
    banner = with_stamps(owners.recent_moves(queue, since)[:3], "created_at", "finished_at")
    for command in banner:
        result = command.result if isinstance(command.result, dict) else {}
        command.to_name = names.get(str(command.args.get("to")), command.args.get("to"))
        source = result.get("from")
        command.from_name = names.get(str(source), source if isinstance(source, str) else "")
    return {**owners.move_options(queue), "banner": banner}


def build_queue(params: QueryDict) -> dict[str, Any]:
    row = _object(QueueSnapshot, params)
    if row is None:
        return _detail("queue", "Queue", None)
    [queue] = with_spread([objects.representative(row)])
    context = _detail("queue", f"Queue {queue.name}", queue)
    context["actions"] = "dashboard/fragments/queue_move.html"
    if queue.shared:
        context["move"] = queue_moves(queue)
    return context


def build_exchange(params: QueryDict) -> dict[str, Any]:
    row = _object(ExchangeSnapshot, params)
    if row is None:
        return _detail("exchange", "Exchange", None)
    shown = objects.representative(row)
    return _detail("exchange", f"Exchange {shown.name or '(default)'}", shown)


def build_binding(params: QueryDict) -> dict[str, Any]:
    row = _object(BindingSnapshot, params)
    if row is None:
        return _detail("binding", "Binding", None)
    shown = objects.representative(row)
    title = f"Binding {shown.source or '(default)'} → {shown.destination}"
    return _detail("binding", title, shown)


build_commands = _list_page(
    filters.CommandFilter,
    Command.objects.select_related("broker", "created_by"),
    ("broker", "name", "state"),
    "created_at",
    "finished_at",
)
_build_audit_list = _list_page(
    filters.AuditFilter, AuditEntry.objects.all(), ("user", "action_prefix", "target"), "time"
)


def build_audit(params: QueryDict) -> dict[str, Any]:
    context = _build_audit_list(params)
    for entry in context["rows"]:
        entry.detail_items = detail_items(entry.details)
    return context


_build_alarm_list = _list_page(
    filters.AlarmFilter,
    Alarm.objects.select_related("broker"),
    ("broker", "kind", "source", "active"),
    "raised_at",
    "cleared_at",
    "acknowledged_at",
)


def build_alarms(params: QueryDict) -> dict[str, Any]:
    context = _build_alarm_list(params)
    context["active_alarms"] = with_stamps(
        Alarm.objects.filter(active=True).select_related("broker"), "raised_at", "acknowledged_at"
    )
    return context


PAGES: dict[str, Page] = {
    page.name: page
    for page in (
        Page(
            "overview",
            "dashboard/overview.html",
            _fragments(
                "cluster_state",
                "broker_table",
                "cluster_members",
                "active_alarms",
                "rate_data",
                "recent",
            ),
            build_overview,
        ),
        Page("brokers", "dashboard/brokers.html", _fragments("broker_table"), build_brokers),
        Page(
            "broker",
            "dashboard/broker.html",
            _fragments(
                "broker_summary",
                "command_banner",
                "broker_events",
                "broker_in_force",
                "peer_links",
                "broker_objects",
                "broker_commands",
                "broker_decommission",
            ),
            build_broker,
        ),
        Page(
            "queues",
            "dashboard/table_page.html",
            _fragments("queue_rebalance", "queue_table"),
            build_queues,
            "Queues",
        ),
        table_page("exchanges", "Exchanges", "exchange_table", build_exchanges),
        table_page("bindings", "Bindings", "binding_table", build_bindings),
        Page(
            "queue", "dashboard/object.html", _fragments("queue_detail", "queue_move"), build_queue
        ),
        Page("exchange", "dashboard/object.html", _fragments("exchange_detail"), build_exchange),
        Page("binding", "dashboard/object.html", _fragments("binding_detail"), build_binding),
        Page(
            "config",
            "dashboard/config.html",
            _fragments("convergence", "config_versions", "config_running"),
            build_config,
        ),
        table_page("commands", "Commands", "command_table", build_commands),
        table_page("audit", "Audit log", "audit_table", build_audit),
        Page("alarms", "dashboard/alarms.html", _fragments("alarm_table"), build_alarms),
        Page("bridges", "dashboard/bridges.html", _fragments("bridge_table"), build_bridges),
    )
}
