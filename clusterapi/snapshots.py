"""Storing the queues, exchanges and bindings of a broker status as snapshot rows.

A status may carry a thousand queues every second from each of 50 brokers
(issue 43), and a full snapshot (every 30th status) mostly repeats what is
stored. So each link remembers the rows it stored (``LinkState.queue_rows``,
``exchange_rows``, ``binding_rows``: read from the database once per link) and a
status writes only what differs: the changed queues through one prepared upsert
(``executemany``) plus their samples, the changed exchanges and bindings the same
way; a full snapshot deletes what it does not list, a delta its ``remove`` keys
(a chunk of keys per query). A status that fails makes the link forget (its
transaction rolled back), so the next one reads the rows again.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
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
    """Queues are the bulk of a status: every entry is checked and its row worked out,
    but only the rows that differ from what this link last stored (``link.queue_rows``,
    read from the database once per link) are written, as tuples through ``executemany``
    of one prepared statement (Django's bulk_create spends most of its time building
    SQL, and SQLite would cut it into 70-row statements). At 50 brokers x 1,000 queues
    a full snapshot mostly repeats what is stored: it costs no read and few writes.

    A row's ``enqueued``/``delivered`` are the queue's counts as the console keeps
    them, never going backwards (see :func:`carried`); its samples keep the broker's
    own counters (the lake's per-broker series). A row's ``updated_at`` is when its
    values last changed (the broker's ``last_seen`` says how fresh they are)."""
    broker_id = link.broker_id
    known = link.queue_rows
    if known is None:
        known = stored_rows(broker_id)
    changed: list[tuple[QueueKey, tuple[Any, ...]]] = []
    samples: list[tuple[Any, ...]] = []
    seen: set[QueueKey] = set()
    sample_every = float(settings.QUEUE_SAMPLE_SECONDS) - 0.05
    db_sample_time = connection.ops.adapt_datetimefield_value(datetime_from(t))
    entries: list[tuple[QueueKey, dict[str, Any], str]] = []
    for i, entry in enumerate(section.upsert):
        where = f"status.queues[{i}]"
        key = (linkparse.key_text(entry, "vhost", where), linkparse.key_text(entry, "name", where))
        if key in seen:
            continue  # a broker never sends one twice; if it did, the first wins
        seen.add(key)
        entries.append((key, entry, where))
    first = [key for key, _, _ in entries if key not in link.counters]
    restarted_at = _run_start(broker_id) if any(key in known for key in first) else None
    floors = queue_floors(
        {
            key
            for key, entry, _ in entries
            if entry.get("shared") and _needs_floor(key, link, known.get(key), entry)
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
        row = known.get(key)
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
        values = (
            bool(entry.get("durable")),
            bool(entry.get("exclusive")),
            bool(entry.get("auto_delete")),
            shared,
            master,
            messages,
            unacked,
            consumers,
            local,
            _shared(spread),
            _shared(replicas),
            counts[0],
            counts[1],
            _shared(linkparse.arguments(entry, where)),
            queue_type(entry, where),
        )
        if row is None or row.values != values:
            changed.append((key, values))
        rate_in, rate_out = _rates(previous, row, (enqueued, delivered), counts, master, t)
        link.counters[key] = (enqueued, delivered, t)
        last = link.sampled.get(key)
        if last is None or t - last >= sample_every:
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
    gone = [key for key in known if key not in seen] if full else section.remove
    _delete_keys(QueueSnapshot, broker_id, ("vhost", "name"), gone)
    for key in gone:
        known.pop(key, None)  # type: ignore[arg-type]
        link.counters.pop(key, None)  # type: ignore[arg-type]
        link.sampled.pop(key, None)  # type: ignore[arg-type]
    _insert_many(
        QueueSnapshot,
        QUEUE_SNAPSHOT_COLUMNS,
        queue_rows(broker_id, changed, now),
        conflict=("broker", "vhost", "name"),
    )
    _insert_many(QueueSample, QUEUE_SAMPLE_COLUMNS, samples)
    updated = now.timestamp()
    for key, values in changed:
        known[key] = StoredRow(values, updated)
    link.queue_rows = known


#: where a value sits in :attr:`StoredRow.values` (``QueueSnapshot.REPORTED`` after its key)
QUEUE_VALUES = QueueSnapshot.REPORTED[2:]
_JSON_VALUES = frozenset(
    i
    for i, name in enumerate(QUEUE_VALUES)
    if isinstance(QueueSnapshot._meta.get_field(name), models.JSONField)
)


def queue_rows(
    broker_id: int, changed: list[tuple[QueueKey, tuple[Any, ...]]], now: dt.datetime
) -> list[tuple[Any, ...]]:
    """The upsert's parameters for the rows that changed (JSON adapted for the database;
    the empty ``{}`` and ``[]`` most queues have, once)."""
    if not changed:
        return []
    db_now = connection.ops.adapt_datetimefield_value(now)
    prep = QueueSnapshot._meta.get_field("arguments").get_db_prep_save
    empty = {dict: prep({}, connection), list: prep([], connection)}

    def adapt(value: Any) -> Any:
        return empty[type(value)] if not value else prep(value, connection)

    return [
        (
            broker_id,
            *key,
            *(adapt(v) if i in _JSON_VALUES else v for i, v in enumerate(values)),
            db_now,
        )
        for key, values in changed
    ]


class StoredRow(NamedTuple):
    """A broker's row of a queue as the database holds it (a link's memory of it)."""

    #: the row's values in :data:`QUEUE_VALUES` order, as Python values
    values: tuple[Any, ...]
    #: when they last changed (``updated_at``), as a timestamp
    updated: float

    @property
    def enqueued(self) -> int:
        return self.values[_ENQUEUED]

    @property
    def delivered(self) -> int:
        return self.values[_DELIVERED]

    @property
    def master(self) -> bool:
        return self.values[_MASTER]


_ENQUEUED = QueueSnapshot.REPORTED.index("enqueued") - 2
_DELIVERED = QueueSnapshot.REPORTED.index("delivered") - 2
_MASTER = QueueSnapshot.REPORTED.index("master") - 2


def stored_rows(broker_id: int) -> dict[QueueKey, StoredRow]:
    """Every queue row of the broker, by key: one query, once per link (after that the
    link remembers what it wrote)."""
    rows = QueueSnapshot.objects.filter(broker_id=broker_id).order_by()
    return {
        (sys.intern(vhost), name): StoredRow(tuple(map(_shared, values)), updated.timestamp())
        for vhost, name, *values, updated in rows.values_list(*QueueSnapshot.REPORTED, "updated_at")
    }


#: the empty ``{}`` and ``[]`` that most rows have, one of each: the links keep every
#: broker's rows in memory (about 0.4 KiB a queue with these, 0.6 without)
_EMPTY: dict[type, Any] = {dict: {}, list: []}


def _shared(value: Any) -> Any:
    """``value``, or the one empty container of its kind if it is empty (never mutated)."""
    if not value and type(value) in _EMPTY:
        return _EMPTY[type(value)]
    return value


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


#: an exchange's values after its key, as :func:`apply_exchanges` compares them
EXCHANGE_VALUES = ("type", "durable", "auto_delete", "internal", "shared", "arguments")
#: a binding's key and its values
BINDING_KEY = ("vhost", "source", "destination", "destination_type", "routing_key")
BINDING_VALUES = ("shared", "arguments")

WiringRows = dict[tuple[str, ...], tuple[Any, ...]]


def apply_exchanges(link: LinkState, section: Section, full: bool, now: dt.datetime) -> None:
    """The broker's exchanges: only those that differ from what the link last stored."""
    rows: WiringRows = {}
    for i, entry in enumerate(section.upsert):
        where = f"status.exchanges[{i}]"
        key = (linkparse.key_text(entry, "vhost", where), linkparse.key_text(entry, "name", where))
        if key not in rows:
            rows[key] = (
                linkparse.key_text(entry, "type", where)[:64],
                bool(entry.get("durable")),
                bool(entry.get("auto_delete")),
                bool(entry.get("internal")),
                bool(entry.get("shared")),
                _shared(linkparse.arguments(entry, where)),
            )
    if link.exchange_rows is None:
        link.exchange_rows = stored_wiring(ExchangeSnapshot, link.broker_id, ("vhost", "name"))
    _store_wiring(ExchangeSnapshot, link.broker_id, link.exchange_rows, rows, section, full, now)


def apply_bindings(link: LinkState, section: Section, full: bool, now: dt.datetime) -> None:
    """The broker's bindings: a full snapshot lists a thousand of them, which rarely
    change between two; only those that differ from what the link last stored are
    written."""
    rows: WiringRows = {}
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
        if key not in rows:
            rows[key] = (bool(entry.get("shared")), _shared(linkparse.arguments(entry, where)))
    if link.binding_rows is None:
        link.binding_rows = stored_wiring(BindingSnapshot, link.broker_id, BINDING_KEY)
    _store_wiring(BindingSnapshot, link.broker_id, link.binding_rows, rows, section, full, now)


def stored_wiring(
    model: type[ExchangeSnapshot] | type[BindingSnapshot], broker_id: int, key: Sequence[str]
) -> WiringRows:
    """The broker's exchange or binding rows, key -> values: one query, once per link."""
    values = EXCHANGE_VALUES if model is ExchangeSnapshot else BINDING_VALUES
    rows = model.objects.filter(broker_id=broker_id).order_by().values_list(*key, *values)
    return {_interned(row[: len(key)]): tuple(map(_shared, row[len(key) :])) for row in rows}


def _interned(key: Sequence[str]) -> tuple[str, ...]:
    """A wiring key whose names (an exchange's, a routing key that is the queue's name)
    are one string each however many rows repeat them."""
    return tuple(sys.intern(part) for part in key)


def _store_wiring(
    model: type[ExchangeSnapshot] | type[BindingSnapshot],
    broker_id: int,
    known: WiringRows,
    rows: WiringRows,
    section: Section,
    full: bool,
    now: dt.datetime,
) -> None:
    """Delete what went (a full snapshot: what it does not list; a delta: its removals),
    upsert what is new or changed, and remember it in ``known``."""
    key = BINDING_KEY if model is BindingSnapshot else ("vhost", "name")
    values = BINDING_VALUES if model is BindingSnapshot else EXCHANGE_VALUES
    gone = [k for k in known if k not in rows] if full else section.remove
    _delete_keys(model, broker_id, key, gone)
    for k in gone:
        known.pop(k, None)
    changed = [(k, v) for k, v in rows.items() if known.get(k) != v]
    if not changed:
        return
    db_now = connection.ops.adapt_datetimefield_value(now)
    prep = model._meta.get_field("arguments").get_db_prep_save
    last = len(values) - 1  # ``arguments``, the one JSON value, comes last
    _insert_many(
        model,
        ("broker", *key, *values, "updated_at"),
        [(broker_id, *k, *v[:last], prep(v[last], connection), db_now) for k, v in changed],
        conflict=("broker", *key),
    )
    known.update((_interned(k), v) for k, v in changed)


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
