"""Storing the queues, exchanges and bindings of a broker status as snapshot rows.

A status may carry a thousand queues every second from each of ten brokers, so
each kind costs a fixed number of queries: queues go through one prepared
upsert (``executemany``) plus their samples, exchanges and bindings through
``bulk_create(update_conflicts=True)``; a full snapshot deletes what it does not
list, a delta deletes its ``remove`` keys (a chunk of keys per query).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, models
from django.db.models import Q

from clusterapi import linkparse
from clusterapi.linkparse import Section
from clusterapi.models import BindingSnapshot, ExchangeSnapshot, QueueSample, QueueSnapshot

if TYPE_CHECKING:
    from clusterapi.ingest import LinkState

#: removals are deleted this many keys per query (bounded SQL size)
DELETE_CHUNK = 200
QueueKey = tuple[str, str]


QUEUE_SNAPSHOT_COLUMNS = (
    "broker",
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
    "updated_at",
)
QUEUE_SAMPLE_COLUMNS = (
    "broker",
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
)


def apply_queues(link: LinkState, section: Section, full: bool, now: dt.datetime, t: float) -> None:
    """Queues are the bulk of a status: rows go out as tuples through ``executemany``
    of one prepared statement (Django's bulk_create spends most of its time building
    SQL, and SQLite would cut it into 70-row statements)."""
    broker_id = link.broker_id
    rows: list[tuple[Any, ...]] = []
    samples: list[tuple[Any, ...]] = []
    seen: set[QueueKey] = set()
    sample_every = float(settings.QUEUE_SAMPLE_SECONDS)
    db_now = connection.ops.adapt_datetimefield_value(now)
    db_sample_time = connection.ops.adapt_datetimefield_value(datetime_from(t))
    json_field = QueueSnapshot._meta.get_field("arguments")
    if full:
        existing = list(
            QueueSnapshot.objects.filter(broker_id=broker_id).values_list(
                "pk", "vhost", "name", "enqueued", "delivered", "updated_at"
            )
        )
        for _pk, vhost, name, enqueued, delivered, updated in existing:
            link.counters.setdefault((vhost, name), (enqueued, delivered, updated.timestamp()))
    for i, entry in enumerate(section.upsert):
        where = f"status.queues[{i}]"
        key = (linkparse.key_text(entry, "vhost", where), linkparse.key_text(entry, "name", where))
        if key in seen:
            continue  # a broker never sends one twice; if it did, the first wins
        seen.add(key)
        enqueued = linkparse.count(entry, "enqueued", where)
        delivered = linkparse.count(entry, "delivered", where)
        messages = linkparse.count(entry, "messages", where)
        unacked = linkparse.count(entry, "unacked", where)
        consumers = linkparse.count(entry, "consumers", where)
        shared = bool(entry.get("shared"))
        master = linkparse.optional(entry, "master", bool, where, True)
        spread = linkparse.consumer_servers(entry, where)
        replicas = linkparse.replicas(entry, where)
        local = consumers
        if shared and master and "consumer_servers" in entry:
            local = spread.get(link.spid, 0)  # a master counts every server's consumers
        rows.append(
            (
                broker_id,
                key[0],
                key[1],
                bool(entry.get("durable")),
                bool(entry.get("exclusive")),
                bool(entry.get("auto_delete")),
                shared,
                master,
                messages,
                unacked,
                consumers,
                local,
                json_field.get_db_prep_save(spread, connection),
                json_field.get_db_prep_save(replicas, connection),
                enqueued,
                delivered,
                json_field.get_db_prep_save(linkparse.arguments(entry, where), connection),
                queue_type(entry, where),
                db_now,
            )
        )
        previous = link.counters.get(key)
        rate_in = rate_out = 0.0
        if previous is not None and t > previous[2]:
            span = t - previous[2]
            rate_in = max(0, enqueued - previous[0]) / span
            rate_out = max(0, delivered - previous[1]) / span
        link.counters[key] = (enqueued, delivered, t)
        last = link.sampled.get(key)
        if last is None or t - last >= sample_every - 0.05:
            link.sampled[key] = t
            samples.append(
                (
                    broker_id,
                    db_sample_time,
                    key[0],
                    key[1],
                    messages,
                    unacked,
                    consumers,
                    enqueued,
                    delivered,
                    rate_in,
                    rate_out,
                )
            )
    if full:
        gone_pks = [pk for pk, vhost, name, *_ in existing if (vhost, name) not in seen]
        _delete_pks(QueueSnapshot, gone_pks)
        for _pk, vhost, name, *_ in existing:
            if (vhost, name) not in seen:
                link.counters.pop((vhost, name), None)
                link.sampled.pop((vhost, name), None)
    else:
        _delete_keys(QueueSnapshot, broker_id, ("vhost", "name"), section.remove)
        for key in section.remove:
            link.counters.pop(key, None)  # type: ignore[arg-type]
            link.sampled.pop(key, None)  # type: ignore[arg-type]
    _insert_many(QueueSnapshot, QUEUE_SNAPSHOT_COLUMNS, rows, conflict=("broker", "vhost", "name"))
    _insert_many(QueueSample, QUEUE_SAMPLE_COLUMNS, samples)


def _insert_many(
    model: type[models.Model],
    fields: Sequence[str],
    rows: list[tuple[Any, ...]],
    conflict: Sequence[str] = (),
) -> None:
    """One prepared INSERT (an upsert on ``conflict``) run for all ``rows``.

    ``INSERT .. ON CONFLICT (..) DO UPDATE SET col = excluded.col`` is the same
    in SQLite (3.24+) and PostgreSQL, the two databases the console supports.
    """
    if not rows:
        return
    meta = model._meta
    quote = connection.ops.quote_name
    columns = [quote(meta.get_field(name).column) for name in fields]
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    if conflict:
        keys = [quote(meta.get_field(name).column) for name in conflict]
        updates = [c for c, name in zip(columns, fields, strict=True) if name not in conflict]
        sql += f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET " + ", ".join(
            f"{c} = excluded.{c}" for c in updates
        )
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def datetime_from(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC)


def apply_exchanges(broker_id: int, section: Section, full: bool, now: dt.datetime) -> None:
    rows: dict[tuple[str, str], ExchangeSnapshot] = {}
    for i, entry in enumerate(section.upsert):
        where = f"status.exchanges[{i}]"
        key = (linkparse.key_text(entry, "vhost", where), linkparse.key_text(entry, "name", where))
        rows.setdefault(
            key,
            ExchangeSnapshot(
                broker_id=broker_id,
                vhost=key[0],
                name=key[1],
                type=linkparse.key_text(entry, "type", where)[:64],
                durable=bool(entry.get("durable")),
                auto_delete=bool(entry.get("auto_delete")),
                internal=bool(entry.get("internal")),
                shared=bool(entry.get("shared")),
                arguments=linkparse.arguments(entry, where),
                updated_at=now,
            ),
        )
    fields = ("vhost", "name")
    if full:
        _replace_all(ExchangeSnapshot, broker_id, fields, rows.keys())
    else:
        _delete_keys(ExchangeSnapshot, broker_id, fields, section.remove)
    _upsert(
        ExchangeSnapshot,
        list(rows.values()),
        ["broker", "vhost", "name"],
        ["type", "durable", "auto_delete", "internal", "shared", "arguments", "updated_at"],
    )


BINDING_KEY = ("vhost", "source", "destination", "destination_type", "routing_key")


def apply_bindings(broker_id: int, section: Section, full: bool, now: dt.datetime) -> None:
    rows: dict[tuple[str, ...], BindingSnapshot] = {}
    for i, entry in enumerate(section.upsert):
        where = f"status.bindings[{i}]"
        destination_type = linkparse.key_text(entry, "destination_type", where)
        if destination_type not in ("queue", "exchange"):
            raise linkparse.LinkProtocolError(f"{where}.destination_type must be queue or exchange")
        key = (
            linkparse.key_text(entry, "vhost", where),
            linkparse.key_text(entry, "source", where),
            linkparse.key_text(entry, "destination", where),
            destination_type,
            linkparse.key_text(entry, "routing_key", where, required=False),
        )
        rows.setdefault(
            key,
            BindingSnapshot(
                broker_id=broker_id,
                **dict(zip(BINDING_KEY, key, strict=True)),
                shared=bool(entry.get("shared")),
                arguments=linkparse.arguments(entry, where),
                updated_at=now,
            ),
        )
    if full:
        _replace_all(BindingSnapshot, broker_id, BINDING_KEY, rows.keys())
    else:
        _delete_keys(BindingSnapshot, broker_id, BINDING_KEY, section.remove)
    _upsert(
        BindingSnapshot,
        list(rows.values()),
        ["broker", *BINDING_KEY],
        ["shared", "arguments", "updated_at"],
    )


def _upsert(
    model: type[models.Model], rows: list[Any], unique: list[str], update: list[str]
) -> None:
    if rows:
        model.objects.bulk_create(
            rows,
            batch_size=500,
            update_conflicts=True,
            unique_fields=unique,
            update_fields=update,
        )


def _replace_all(
    model: type[models.Model], broker_id: int, fields: Sequence[str], keep: Iterable[tuple]
) -> None:
    """Delete the broker's rows whose key is not in ``keep`` (a full snapshot)."""
    wanted = set(keep)
    existing = model.objects.filter(broker_id=broker_id).values_list("pk", *fields)
    _delete_pks(model, [pk for pk, *key in existing if tuple(key) not in wanted])


def _delete_pks(model: type[models.Model], pks: list[int]) -> None:
    for start in range(0, len(pks), DELETE_CHUNK * 4):
        model.objects.filter(pk__in=pks[start : start + DELETE_CHUNK * 4]).delete()


def _delete_keys(
    model: type[models.Model], broker_id: int, fields: Sequence[str], keys: Sequence[tuple]
) -> None:
    for start in range(0, len(keys), DELETE_CHUNK):
        chunk = keys[start : start + DELETE_CHUNK]
        match = reduce(or_, (Q(**dict(zip(fields, key, strict=True))) for key in chunk))
        model.objects.filter(match, broker_id=broker_id).delete()


def queue_type(entry: dict[str, Any], where: str) -> str:
    """The type a broker reports for a queue ("" from a broker that reports none)."""
    value = linkparse.optional(entry, "type", str, where, "")
    return value if value in QueueSnapshot.KINDS else ""
