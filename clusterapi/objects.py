"""Queues, exchanges and bindings of the whole cluster: each shared object once.

Every broker reports what it has, one snapshot row per broker and object. A
shared queue is one queue whose messages are on the root (its master) with a
proxy on every other server, and shared wiring (exchanges of the cluster vhost,
bindings of shared queues and exchanges) is the same on every server; private
queues and their bindings are on one server only. So the cluster-wide lists
show every private row, and for each shared object the one row that speaks for
it (the *representative*):

- a queue: its master's row (the broker holding its messages). Were two brokers
  to report mastering it (a root that died and its successor, before the console
  marks the old one down) the up one wins, then the last updated. With no master
  reported (the root is not linked to the console, or an election is under way)
  one proxy's row stands in, with ``master`` false: its depth is not known.
- an exchange or a binding: the root's copy when the root reports it, else an up
  broker's, else the oldest row.

The choice is made in SQL (a correlated NOT EXISTS over the (vhost, name) index),
so filters, ordering and pagination work on the lists as on any queryset.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from typing import Any

from django.db import connection, models
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from clusterapi.models import BindingSnapshot, Broker, ExchangeSnapshot, QueueSnapshot

QUEUE_KEY = ("vhost", "name")
EXCHANGE_KEY = ("vhost", "name")
BINDING_KEY = ("vhost", "source", "destination", "destination_type", "routing_key")
KEYS: dict[type[models.Model], tuple[str, ...]] = {
    QueueSnapshot: QUEUE_KEY,
    ExchangeSnapshot: EXCHANGE_KEY,
    BindingSnapshot: BINDING_KEY,
}

_LONG_AGO = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _flag(condition: Q) -> Case:
    return Case(When(condition, then=Value(1)), default=Value(0), output_field=IntegerField())


def _queue_ranks() -> dict[str, Any]:
    """Why one queue row beats another, most important first (higher wins)."""
    return {
        "rank_master": _flag(Q(master=True)),
        "rank_up": _flag(Q(broker__state=Broker.STATE_UP)),
        "rank_fresh": Case(
            When(master=True, then=F("updated_at")),
            default=Value(_LONG_AGO),
            output_field=models.DateTimeField(),
        ),
    }


def _wiring_ranks() -> dict[str, Any]:
    return {
        "rank_root": _flag(Q(broker__is_root=True, broker__state=Broker.STATE_UP)),
        "rank_up": _flag(Q(broker__state=Broker.STATE_UP)),
    }


def _once(model: type[models.Model], ranks: dict[str, Any]) -> QuerySet:
    """Every private row, and the best-ranked row of each shared object (ties: the
    lowest id)."""
    key = KEYS[model]
    better = Q(pk__lt=OuterRef("pk"))
    for name in reversed(list(ranks)):
        better = Q(**{f"{name}__gt": OuterRef(name)}) | (Q(**{name: OuterRef(name)}) & better)
    rivals = (
        model.objects.filter(shared=True, **{field: OuterRef(field) for field in key})
        .exclude(pk=OuterRef("pk"))
        .annotate(**ranks)
        .filter(better)
    )
    return model.objects.annotate(**ranks).filter(Q(shared=False) | ~Exists(rivals))


def _with_servers(queryset: QuerySet) -> QuerySet:
    """``servers``: how many brokers report the row's object (a private one: 1)."""
    model = queryset.model
    key = KEYS[model]
    same = (
        model.objects.filter(shared=True, **{field: OuterRef(field) for field in key})
        .order_by()
        .values(key[0])
        .annotate(n=Count("pk"))
        .values("n")
    )
    return queryset.annotate(
        servers=Case(
            When(shared=True, then=Subquery(same, output_field=IntegerField())),
            default=Value(1),
            output_field=IntegerField(),
        )
    )


def queues() -> QuerySet[QueueSnapshot]:
    """One row per queue of the cluster (see the module docstring)."""
    return _once(QueueSnapshot, _queue_ranks()).select_related("broker")


def exchanges() -> QuerySet[ExchangeSnapshot]:
    return _with_servers(_once(ExchangeSnapshot, _wiring_ranks())).select_related("broker")


def bindings() -> QuerySet[BindingSnapshot]:
    return _with_servers(_once(BindingSnapshot, _wiring_ranks())).select_related("broker")


def exchange_rows() -> QuerySet[ExchangeSnapshot]:
    """Every broker's row (a detail may be asked for by any of them), with ``servers``."""
    return _with_servers(ExchangeSnapshot.objects.select_related("broker"))


def binding_rows() -> QuerySet[BindingSnapshot]:
    return _with_servers(BindingSnapshot.objects.select_related("broker"))


def per_broker(row: models.Model) -> list[Any]:
    """The rows of every broker that reports ``row``'s object, by broker name: a shared
    object's copies (or proxies), or the private row alone."""
    if not row.shared:
        return [row]
    key = {field: getattr(row, field) for field in KEYS[type(row)]}
    return list(
        type(row)
        .objects.filter(shared=True, **key)
        .select_related("broker")
        .order_by("broker__name")
    )


def representative(row: models.Model) -> models.Model:
    """The row the cluster-wide list shows for ``row``'s object (``row`` itself if private)."""
    if not row.shared:
        return row
    model = type(row)
    found = {QueueSnapshot: queues, ExchangeSnapshot: exchanges, BindingSnapshot: bindings}[
        model
    ]().filter(**{field: getattr(row, field) for field in KEYS[model]}, shared=True)
    return found.first() or row


#: a broker id as the API and the dashboard accept it: ASCII digits, small enough for the database
_PK = re.compile(r"[0-9]{1,18}")


def broker_pk(value: str) -> int | None:
    """``value`` as a broker id, or None if it is a name. Only ASCII digits count:
    ``str.isdigit()`` also accepts '¹6', which ``int()`` then refuses (a 500)."""
    return int(value) if _PK.fullmatch(value) else None


def matching_brokers(value: str) -> QuerySet[Broker]:
    """Brokers given by id or name (``host:port``), as every ``broker`` filter takes them."""
    pk = broker_pk(value)
    match = Q(name=value) | Q(pk=pk) if pk is not None else Q(name=value)
    return Broker.objects.filter(match)


def reported_by(queryset: QuerySet, value: str) -> QuerySet:
    """Rows whose object the given broker reports: its private ones, and the shared
    ones it has a copy of (whichever broker's row represents them)."""
    model = queryset.model
    ids = matching_brokers(value).values("pk")
    copy = model.objects.filter(
        shared=True, broker_id__in=ids, **{field: OuterRef(field) for field in KEYS[model]}
    )
    return queryset.filter(Q(shared=False, broker_id__in=ids) | Q(shared=True) & Exists(copy))


def consumers_on(queryset: QuerySet[QueueSnapshot], value: str) -> QuerySet[QueueSnapshot]:
    """Queues with consumers connected to the given broker, as that broker reports them:
    its private queues with consumers, and shared queues it has consumers on."""
    ids = matching_brokers(value).values("pk")
    here = QueueSnapshot.objects.filter(
        shared=True,
        broker_id__in=ids,
        local_consumers__gt=0,
        vhost=OuterRef("vhost"),
        name=OuterRef("name"),
    )
    return queryset.filter(
        Q(shared=False, broker_id__in=ids, local_consumers__gt=0) | Q(shared=True) & Exists(here)
    )


def spid_names() -> dict[str, str]:
    """Broker names by the spid of their current run."""
    return dict(Broker.objects.exclude(spid="").values_list("spid", "name"))


def consumer_spread(queue: QueueSnapshot, names: dict[str, str]) -> list[dict[str, Any]]:
    """Where the queue's consumers are connected, by broker: a shared queue as its master
    counts them, a private one all on its own broker. A proxy row (no master reported)
    does not know: empty."""
    if not queue.shared:
        if not queue.consumers:
            return []
        return [
            {"broker": queue.broker.name, "spid": queue.broker.spid, "consumers": queue.consumers}
        ]
    if not queue.master:
        return []
    spread = queue.consumer_servers if isinstance(queue.consumer_servers, dict) else {}
    rows = [
        {"broker": names.get(spid), "spid": spid, "consumers": n}
        for spid, n in spread.items()
        if isinstance(n, int) and n > 0
    ]
    return sorted(rows, key=lambda r: (r["broker"] is None, r["broker"] or "", r["spid"]))


def replica_set(queue: QueueSnapshot, names: dict[str, str]) -> list[dict[str, Any]]:
    """The servers holding a copy of a shared queue as its master reports them, each
    with its broker name (None: not linked to the console), in-sync state and lag,
    sorted like the consumer spread. Empty for a proxy row (it does not know), a
    classic or private queue (no copies), or a root alone. Ingest checked each item;
    a row written some other way (the admin) is read leniently, never a 500."""
    if not queue.master or not isinstance(queue.replicas, list):
        return []
    rows = [
        {
            "broker": names.get(r["spid"]),
            "spid": r["spid"],
            "in_sync": r.get("in_sync") is True,
            "behind": r.get("behind") if isinstance(r.get("behind"), int) else 0,
        }
        for r in queue.replicas
        if isinstance(r, dict) and isinstance(r.get("spid"), str)
    ]
    return sorted(rows, key=lambda r: (r["broker"] is None, r["broker"] or "", r["spid"]))


def counts() -> dict[str, int]:
    """How many queues, exchanges and bindings the cluster has, each shared one once
    (what the lists count): a few COUNT queries over the (vhost, name) indexes."""

    def once(model: type[models.Model]) -> tuple[int, int]:
        private = model.objects.filter(shared=False).count()
        shared = _shared_objects(model)
        return private + shared, shared

    queue_total, queue_shared = once(QueueSnapshot)
    return {
        "queues": queue_total,
        "shared_queues": queue_shared,
        "exchanges": once(ExchangeSnapshot)[0],
        "bindings": once(BindingSnapshot)[0],
    }


def _shared_objects(model: type[models.Model]) -> int:
    """How many shared objects the rows of ``model`` stand for (each key once).

    SQLite, which has no statistics, walks the key's index for the DISTINCT and looks
    every row up to test ``shared``: at 50 brokers x 1,000 queues 20 ms where a scan
    of the table takes 5 (and never more than the index, however many are shared), so
    there the table is scanned, ``NOT INDEXED``."""
    rows = model.objects.filter(shared=True).values(*KEYS[model]).distinct()
    if connection.vendor != "sqlite":
        return rows.count()
    meta = model._meta
    quote = connection.ops.quote_name
    key = ", ".join(quote(meta.get_field(name).column) for name in KEYS[model])
    shared = quote(meta.get_field("shared").column)
    sql = (
        f"SELECT COUNT(*) FROM (SELECT DISTINCT {key} FROM {quote(meta.db_table)} "
        f"NOT INDEXED WHERE {shared})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


def messages_ready(brokers: Iterable[Broker]) -> int:
    """Messages ready in the cluster: what the up brokers hold (a shared queue's messages
    are on its master only, so nothing is counted twice)."""
    total = 0
    for broker in brokers:
        ready = (broker.counts or {}).get("messages_ready")
        if broker.state == Broker.STATE_UP and isinstance(ready, int):
            total += ready
    return total


def brokers(retired: bool = False) -> QuerySet[Broker]:
    """Brokers with ``queues_held``: the queues whose messages each holds (its private
    queues and the shared ones it owns; not its proxies), and ``shared_owned``: those
    shared ones (each queue has one owner among the primaries, whatever its type).
    Retired brokers only with ``retired`` (their pages and API details are history).
    Each count is a subquery over the broker's rows (its ``(broker, vhost, name)``
    index): at 50 brokers x 1,000 queues a join grouped by every broker column took
    37 ms of CPU, the subqueries 22 (every live render of the overview has it)."""
    rows = Broker.objects.all() if retired else Broker.objects.active()
    return rows.annotate(
        queues_held=_queue_count(master=True), shared_owned=_queue_count(master=True, shared=True)
    ).order_by("name")


def _queue_count(**match: Any) -> Coalesce:
    """How many of the broker's queue rows match (0 for none)."""
    rows = (
        QueueSnapshot.objects.filter(broker=OuterRef("pk"), **match)
        .order_by()
        .values("broker")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), Value(0))
