"""Storing the queues, exchanges and bindings of a broker status as snapshot rows.

A status may carry a thousand queues every second from each of ten brokers, so
each kind costs a fixed number of queries: queues go through one read of the
broker's rows (their counts so far), one prepared upsert (``executemany``) plus
their samples, exchanges and bindings through
``bulk_create(update_conflicts=True)``; a full snapshot deletes what it does not
list, a delta deletes its ``remove`` keys (a chunk of keys per query).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Any, NamedTuple

from django.conf import settings
from django.db import connection, models
from django.db.models import Max, Q

from clusterapi import linkparse
from clusterapi.linkparse import Section
from clusterapi.models import (
    BindingSnapshot,
    Broker,
    ExchangeSnapshot,
    QueueSample,
    QueueSnapshot,
)

if TYPE_CHECKING:
    from clusterapi.ingest import LinkState

#: removals are deleted this many keys per query (bounded SQL size)
DELETE_CHUNK = 200
QueueKey = tuple[str, str]


#: the columns a status fills (the API shows the same: ``clusterapi.api``)
QUEUE_SNAPSHOT_COLUMNS = ("broker", *QueueSnapshot.REPORTED, "updated_at")
QUEUE_SAMPLE_COLUMNS = ("broker", "time", *QueueSample.REPORTED)


def apply_queues(link: LinkState, section: Section, full: bool, now: dt.datetime, t: float) -> None:
    """Queues are the bulk of a status: rows go out as tuples through ``executemany``
    of one prepared statement (Django's bulk_create spends most of its time building
    SQL, and SQLite would cut it into 70-row statements).

    A row's ``enqueued``/``delivered`` are the queue's counts as the console keeps
    them, never going backwards (see :func:`carried`); its samples keep the broker's
    own counters (the lake's per-broker series)."""
    broker_id = link.broker_id
    rows: list[tuple[Any, ...]] = []
    samples: list[tuple[Any, ...]] = []
    seen: set[QueueKey] = set()
    sample_every = float(settings.QUEUE_SAMPLE_SECONDS)
    db_now = connection.ops.adapt_datetimefield_value(now)
    db_sample_time = connection.ops.adapt_datetimefield_value(datetime_from(t))
    json_field = QueueSnapshot._meta.get_field("arguments")
    entries: list[tuple[QueueKey, dict[str, Any], str]] = []
    for i, entry in enumerate(section.upsert):
        where = f"status.queues[{i}]"
        key = (linkparse.key_text(entry, "vhost", where), linkparse.key_text(entry, "name", where))
        if key in seen:
            continue  # a broker never sends one twice; if it did, the first wins
        seen.add(key)
        entries.append((key, entry, where))
    existing = stored_rows(broker_id, None if full else [key for key, _, _ in entries])
    first = [key for key, _, _ in entries if key not in link.counters]
    restarted_at = _run_start(broker_id) if any(key in existing for key in first) else None
    floors = queue_floors(
        {
            key
            for key, entry, _ in entries
            if entry.get("shared") and _needs_floor(key, link, existing.get(key), entry)
        }
    )
    for key, entry, where in entries:
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
        row = existing.get(key)
        previous = link.counters.get(key)
        restarted = row is not None and restarted_at is not None and row.updated < restarted_at
        floor = floors.get(key, (0, 0))
        counts = tuple(
            carried(
                raw,
                master=master,
                before=None if previous is None else previous[i],
                stored=None if row is None else (row.enqueued, row.delivered)[i],
                was_master=row is not None and row.master,
                floor=floor[i],
                restarted=restarted,
            )
            for i, raw in enumerate((enqueued, delivered))
        )
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
                counts[0],
                counts[1],
                json_field.get_db_prep_save(linkparse.arguments(entry, where), connection),
                queue_type(entry, where),
                db_now,
            )
        )
        rate_in, rate_out = _rates(previous, row, (enqueued, delivered), counts, master, t)
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
        gone = [key for key in existing if key not in seen]
        _delete_pks(QueueSnapshot, [existing[key].pk for key in gone])
        for key in gone:
            link.counters.pop(key, None)
            link.sampled.pop(key, None)
    else:
        _delete_keys(QueueSnapshot, broker_id, ("vhost", "name"), section.remove)
        for key in section.remove:
            link.counters.pop(key, None)  # type: ignore[arg-type]
            link.sampled.pop(key, None)  # type: ignore[arg-type]
    _insert_many(QueueSnapshot, QUEUE_SNAPSHOT_COLUMNS, rows, conflict=("broker", "vhost", "name"))
    _insert_many(QueueSample, QUEUE_SAMPLE_COLUMNS, samples)


# -- the queue counters the console shows: cumulative across owners and restarts -----------
#
# A broker counts a queue's messages in and out from 0 in each run, and a shared queue's
# count is its owner's: after a move the new owner reports its own (from its time as a
# proxy), after a restart the owner starts again from 0. The console keeps one count
# per queue that only goes up, as a management UI's message totals do: each row stores
# the queue's count as known through it (its master row adds what the broker counted
# since its last status; a proxy row keeps what it last had), and a row that becomes
# the master continues from the highest count any row of the queue holds (the *floor*).


class StoredRow(NamedTuple):
    """A broker's row of a queue as the database holds it before this status."""

    pk: int
    enqueued: int
    delivered: int
    master: bool
    updated: float


#: a delta this long or longer reads every row of the broker rather than its keys
READ_ALL_ROWS = 200


def stored_rows(broker_id: int, keys: Sequence[QueueKey] | None) -> dict[QueueKey, StoredRow]:
    """The broker's queue rows (only those of ``keys`` unless None), by key: one query
    (a long delta reads them all, cheaper than a long IN list)."""
    rows = QueueSnapshot.objects.filter(broker_id=broker_id)
    if keys is not None:
        if not keys:
            return {}
        if len(keys) < READ_ALL_ROWS:
            rows = rows.filter(name__in={name for _, name in keys})
    return {
        (vhost, name): StoredRow(pk, enqueued, delivered, master, updated.timestamp())
        for pk, vhost, name, enqueued, delivered, master, updated in rows.order_by().values_list(
            "pk", "vhost", "name", "enqueued", "delivered", "master", "updated_at"
        )
    }


def queue_floors(keys: set[QueueKey]) -> dict[QueueKey, tuple[int, int]]:
    """Per shared queue of ``keys``: the highest (enqueued, delivered) any broker's row
    of it holds, so a new master goes on from where the queue's count was."""
    floors: dict[QueueKey, tuple[int, int]] = {}
    names = sorted({name for _, name in keys})
    for start in range(0, len(names), DELETE_CHUNK):
        found = (
            QueueSnapshot.objects.filter(shared=True, name__in=names[start : start + DELETE_CHUNK])
            .order_by()
            .values("vhost", "name")
            .annotate(top_in=Max("enqueued"), top_out=Max("delivered"))
        )
        for row in found:
            key = (row["vhost"], row["name"])
            if key in keys:
                floors[key] = (row["top_in"], row["top_out"])
    return floors


def _needs_floor(
    key: QueueKey, link: LinkState, row: StoredRow | None, entry: dict[str, Any]
) -> bool:
    """Whether a shared queue's count here must start from its floor: its row is new, or
    it is the master now without having been it in this link's last status."""
    if row is None:
        return True
    if not entry.get("master", True):
        return False
    return key not in link.counters or not row.master


def _run_start(broker_id: int) -> float | None:
    """When the broker's current run started (its hello), as a timestamp."""
    start = Broker.objects.filter(pk=broker_id).values_list("start_time", flat=True).first()
    return None if start is None else start.timestamp()


def carried(
    raw: int,
    *,
    master: bool,
    before: int | None,
    stored: int | None,
    was_master: bool,
    floor: int,
    restarted: bool,
) -> int:
    """The count to store for one counter of one row.

    ``raw`` is what the broker reports now; ``before`` what it reported in this link's
    last status (None: the first since the link opened); ``stored`` the row's count
    (None: a new row); ``floor`` the highest count of any row of the queue (shared
    queues; 0 otherwise); ``restarted``: the row was written by an earlier run of the
    broker. The result is never below ``stored``."""
    if not master:
        # a proxy's own counters are its traffic, not the queue's: it keeps the count
        return stored if stored is not None else floor
    base = max(floor, stored or 0)
    if before is None:
        if stored is not None and restarted:
            return base + raw  # its counters began again at 0 when it started
        # the same run (a console restart, a reconnect) or a row new to the console: what
        # it counted while unlinked is not known, so never more than its own counter
        return max(base, raw)
    gain = raw - before if raw >= before else raw  # a drop is a reset: it counts from 0
    if stored is not None and was_master:
        return stored + gain
    return base + gain  # master here since the last status (a move): go on from the floor


def _rates(
    previous: tuple[int, int, float] | None,
    row: StoredRow | None,
    raw: tuple[int, int],
    counts: tuple[int, ...],
    master: bool,
    t: float,
) -> tuple[float, float]:
    """Messages in and out per second since the last status (a reset counts from 0);
    for the first status of a link, since the row was written, when it was the master
    then and now (else 0: the change is an owner's, not traffic)."""
    if previous is not None:
        span = t - previous[2]
        if span <= 0:
            return 0.0, 0.0
        gains = [
            now - then if now >= then else now for now, then in zip(raw, previous, strict=False)
        ]
        return gains[0] / span, gains[1] / span
    if row is None or not (master and row.master) or t <= row.updated:
        return 0.0, 0.0
    span = t - row.updated
    return (counts[0] - row.enqueued) / span, (counts[1] - row.delivered) / span


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
