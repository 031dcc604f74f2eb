"""Turning broker-link messages into rows (docs/protocol.md, "Console link").

The link consumer parses each message here and applies it in one transaction.
A ``status`` arrives from every broker every heartbeat (10 brokers x 1,000
queues at 1 Hz is the design load), so applying one costs a fixed number of
queries whatever its size: the broker row is updated with one UPDATE, the
heartbeat sample is one INSERT, queue samples one bulk INSERT, snapshot upserts
one bulk INSERT .. ON CONFLICT per kind, removals one DELETE per chunk. What the
link needs across statuses (last ``seq``, queue counters for rates, the active
broker alarms) lives in :class:`LinkState`, so nothing is read back per status
except on a full snapshot.

Malformed messages raise :class:`LinkProtocolError`; the consumer closes the
socket with code 4400 and the error as the reason.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from operator import or_
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from clusterapi import alarms, audit, convergence
from clusterapi.models import (
    BindingSnapshot,
    Broker,
    ExchangeSnapshot,
    HeartbeatSample,
    QueueSample,
    QueueSnapshot,
)

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
#: statuses whose ``time`` is further than this from the console's clock are
#: sampled at the console's time (a broker with a wrong clock must not scatter charts)
MAX_CLOCK_SKEW = 300.0
#: removals are deleted this many keys per query (bounded SQL size)
DELETE_CHUNK = 200

QueueKey = tuple[str, str]
#: ``LinkState.running_config`` when the link does not know what the row says
UNKNOWN_RUNNING: tuple[int | None, str] = (None, "?")


class LinkProtocolError(ValueError):
    """A malformed broker-link message; the text is the close reason."""


# -- parsing ---------------------------------------------------------------------------


def _require(msg: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    if key not in msg:
        raise LinkProtocolError(f"{where}.{key} is missing")
    value = msg[key]
    if not _is(value, kinds):
        raise LinkProtocolError(f"{where}.{key} has the wrong type")
    return value


def _optional(
    msg: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str, default: Any
) -> Any:
    value = msg.get(key)
    if value is None:
        return default
    if not _is(value, kinds):
        raise LinkProtocolError(f"{where}.{key} has the wrong type")
    return value


def _is(value: Any, kinds: type | tuple[type, ...]) -> bool:
    # JSON booleans are ints to Python: never accept one where a number is wanted
    if isinstance(value, bool):
        return kinds is bool or (isinstance(kinds, tuple) and bool in kinds)
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, kinds)


def _number(msg: dict[str, Any], key: str, where: str, default: float = 0.0) -> float:
    return float(_optional(msg, key, (int, float), where, default))


def _count(msg: dict[str, Any], key: str, where: str) -> int:
    return _optional(msg, key, int, where, 0)


def _text(msg: dict[str, Any], key: str, where: str, limit: int = 255) -> str:
    value = _optional(msg, key, str, where, "")
    if len(value) > limit:
        raise LinkProtocolError(f"{where}.{key} is longer than {limit} characters")
    return value


def epoch(value: float, where: str) -> dt.datetime:
    """Epoch seconds from a broker as an aware datetime."""
    if not 0 <= value < 1e11:
        raise LinkProtocolError(f"{where} is not a time in epoch seconds")
    return dt.datetime.fromtimestamp(value, tz=dt.UTC)


def parse_envelope(msg: Any) -> str:
    """Check ``v`` and return ``type``."""
    if not isinstance(msg, dict):
        raise LinkProtocolError("a message must be a JSON object")
    if msg.get("v") != PROTOCOL_VERSION:
        raise LinkProtocolError(f"unsupported protocol version {msg.get('v')!r} (expected 1)")
    kind = msg.get("type")
    if not isinstance(kind, str) or not kind:
        raise LinkProtocolError("message.type is missing")
    return kind


@dataclass(frozen=True)
class Hello:
    spid: str
    name: str
    address: str
    broker_type: str
    version: str
    start_time: dt.datetime | None
    cluster: str
    checksum: str
    heartbeat_interval: float
    config_version: int | None
    config_checksum: str


def parse_hello(msg: dict[str, Any]) -> Hello:
    name = _require(msg, "name", str, "hello").strip()
    if not name or len(name) > 255:
        raise LinkProtocolError("hello.name must be 1 to 255 characters")
    broker_type = _require(msg, "broker_type", str, "hello")
    if broker_type not in dict(Broker.TYPE_CHOICES):
        raise LinkProtocolError(
            f"hello.broker_type {broker_type!r} is not one of primary, secondary, standalone"
        )
    interval = _number(msg, "heartbeat_interval", "hello", 1.0)
    if not 0 < interval <= 3600:
        raise LinkProtocolError("hello.heartbeat_interval must be in (0, 3600] seconds")
    start = _optional(msg, "start_time", (int, float), "hello", None)
    config_version = _optional(msg, "config_version", int, "hello", None)
    return Hello(
        spid=_require(msg, "spid", str, "hello")[:64],
        name=name,
        address=_text(msg, "address", "hello"),
        broker_type=broker_type,
        version=_text(msg, "version", "hello", 64),
        start_time=None if start is None else epoch(start, "hello.start_time"),
        cluster=_text(msg, "cluster", "hello"),
        checksum=_text(msg, "checksum", "hello", 64),
        heartbeat_interval=interval,
        config_version=config_version,
        config_checksum=_text(msg, "config_checksum", "hello", 64),
    )


@dataclass
class Section:
    """Queues, exchanges or bindings of one status: a full list or a delta."""

    upsert: list[dict[str, Any]]
    remove: list[tuple[str, ...]]


def _section(msg: dict[str, Any], key: str, full: bool, key_len: int) -> Section | None:
    raw = msg.get(key)
    if raw is None:
        return None
    if full:
        if not isinstance(raw, list):
            raise LinkProtocolError(f"status.{key} must be a list in a full status")
        return Section(upsert=_entries(raw, key), remove=[])
    if not isinstance(raw, dict):
        raise LinkProtocolError(f"status.{key} must be an object with upsert/remove in a delta")
    upsert = _optional(raw, "upsert", list, f"status.{key}", [])
    remove = _optional(raw, "remove", list, f"status.{key}", [])
    keys = []
    for i, item in enumerate(remove):
        if (
            not isinstance(item, list)
            or len(item) != key_len
            or not all(isinstance(part, str) for part in item)
        ):
            raise LinkProtocolError(f"status.{key}.remove[{i}] must be a list of {key_len} strings")
        keys.append(tuple(item))
    return Section(upsert=_entries(upsert, key), remove=keys)


def _entries(raw: list[Any], key: str) -> list[dict[str, Any]]:
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise LinkProtocolError(f"status.{key}[{i}] must be an object")
    return raw


# -- per-link state ------------------------------------------------------------------


@dataclass
class LinkState:
    """What one open broker link remembers between messages."""

    broker_id: int
    name: str
    broker_type: str = Broker.TYPE_STANDALONE
    last_seq: int | None = None
    awaiting_full: bool = True
    #: (vhost, queue) -> (enqueued, delivered, status time) of the last status carrying it
    counters: dict[QueueKey, tuple[int, int, float]] = field(default_factory=dict)
    #: (vhost, queue) -> status time of its last QueueSample
    sampled: dict[QueueKey, float] = field(default_factory=dict)
    #: kind -> message of the broker-raised alarms active now (None: not loaded yet)
    broker_alarms: dict[str, str] | None = None
    #: the broker's spid in this run (from hello), kept on every HeartbeatSample
    spid: str = ""
    #: (version, checksum) of the configuration it last reported running
    running_config: tuple[int | None, str] = (None, "")


@dataclass
class StatusOutcome:
    resync: bool = False
    alarms_changed: bool = False
    state_changed: bool = False
    config_changed: bool = False


# -- hello -----------------------------------------------------------------------------


def register_hello(hello: Hello, channel_name: str = "") -> tuple[Broker, bool]:
    """Upsert the broker by name and mark it up and connected; returns it and whether it
    came back (it was down or never seen)."""
    now = timezone.now()
    values = {
        "spid": hello.spid,
        "address": hello.address,
        "broker_type": hello.broker_type,
        "version": hello.version,
        "start_time": hello.start_time,
        "cluster": hello.cluster,
        "checksum": hello.checksum,
        "heartbeat_interval": hello.heartbeat_interval,
        "config_version": hello.config_version,
        "config_checksum": hello.config_checksum,
        "connected": True,
        "link_channel": channel_name,
        "last_seen": now,
    }
    with transaction.atomic():
        broker, created = Broker.objects.get_or_create(name=hello.name, defaults=values)
        previous = None if created else broker.state
        if not created:
            for key, value in values.items():
                setattr(broker, key, value)
        broker.state = Broker.STATE_UP
        broker.save()
        came_back = previous != Broker.STATE_UP
        if came_back:
            _mark_up(broker, previous)
    log.info(
        "broker %s connected (spid=%s type=%s config_version=%s)",
        broker.name,
        broker.spid,
        broker.broker_type,
        broker.config_version,
    )
    return broker, came_back


def _mark_up(broker: Broker, previous: str | None) -> None:
    alarms.clear_alarm(alarms.BROKER_DOWN, broker)
    audit.record(
        None, "broker.up", broker.name, {"spid": broker.spid, "previous_state": previous or "new"}
    )


def mark_disconnected(broker_id: int, channel_name: str = "") -> bool:
    """The link on ``channel_name`` closed: not connected any more, unless the broker
    has reconnected on another link meanwhile (stale detection decides about down)."""
    return bool(
        Broker.objects.filter(pk=broker_id, link_channel=channel_name).update(
            connected=False, link_channel="", updated_at=timezone.now()
        )
    )


# -- status ----------------------------------------------------------------------------


def _name_taken_by_another(link: LinkState) -> bool:
    """Two live brokers report the same name (a copied data directory, a wrong
    ``--bind``): the one that said hello last owns the row; statuses from the
    other are dropped, with an alarm, rather than interleaved into one broker.
    Called only when the status's UPDATE (filtered on this link's spid) matched no row."""
    owner = Broker.objects.filter(pk=link.broker_id).values_list("spid", flat=True).first()
    if owner is None or owner == link.spid:
        return False
    broker = Broker.objects.get(pk=link.broker_id)
    alarms.raise_alarm(
        alarms.NAME_CONFLICT,
        f"two brokers report the name {link.name}: spids {owner} (shown) and {link.spid} "
        "(its statuses are ignored); give each broker its own address",
        broker,
    )
    return True


def apply_status(link: LinkState, msg: dict[str, Any]) -> StatusOutcome:
    """Validate one status and store it; see the module docstring for its cost."""
    seq = _require(msg, "seq", int, "status")
    sent = epoch(float(_require(msg, "time", (int, float), "status")), "status.time")
    full = _require(msg, "full", bool, "status")
    view = _optional(msg, "view", dict, "status", {})
    counts = _optional(msg, "counts", dict, "status", {})
    totals = _optional(msg, "totals", dict, "status", {})
    rates = _optional(msg, "rates", dict, "status", {})
    queues = _section(msg, "queues", full, 2)
    exchanges = _section(msg, "exchanges", full, 2)
    bindings = _section(msg, "bindings", full, 5)
    peers = _optional(view, "peers", list, "status.view", [])
    reported_alarms = _broker_alarms(_optional(view, "alarms", list, "status.view", []))
    running = _running_config(msg)

    outcome = StatusOutcome()
    if link.last_seq is not None and seq != link.last_seq + 1:
        log.info(
            "broker %s: status seq %d after %d: asking for a resync", link.name, seq, link.last_seq
        )
        outcome.resync = True
        link.awaiting_full = True
    link.last_seq = seq
    if full:
        link.awaiting_full = False
    elif link.awaiting_full and not outcome.resync and seq == 0:
        outcome.resync = True  # a first status that is a delta: we have nothing to apply it to

    now = timezone.now()
    sample_time = sent if abs((sent - now).total_seconds()) <= MAX_CLOCK_SKEW else now
    t = sample_time.timestamp()
    peer_rows = [_peer(p, i) for i, p in enumerate(peers)]

    with transaction.atomic():
        # the row is updated only while this link's broker owns the name (its spid), so
        # the name-conflict check costs a query only when that update matched nothing
        owned = Broker.objects.filter(pk=link.broker_id)
        if link.spid:
            owned = owned.filter(spid=link.spid)
        reported = {}
        if running is not None:
            reported = {"config_version": running[0], "config_checksum": running[1]}
        updated = owned.update(
            **reported,
            connected=True,
            last_seen=now,
            is_root=bool(view.get("is_root")),
            root_enabled=bool(view.get("root_enabled", True)),
            ready=bool(view.get("ready")),
            quorum=quorum_text(view, peers, link.broker_type == Broker.TYPE_PRIMARY),
            checksum=str(view.get("checksum") or "")[:64],
            counts=counts,
            totals=totals,
            rates=rates,
            view=view,
            updated_at=now,
        )
        if not updated and link.spid and _name_taken_by_another(link):
            outcome.alarms_changed = True
            return outcome
        if (
            Broker.objects.filter(pk=link.broker_id)
            .exclude(state=Broker.STATE_UP)
            .update(state=Broker.STATE_UP)
        ):
            broker = Broker.objects.get(pk=link.broker_id)
            _mark_up(broker, None)
            outcome.state_changed = True
        HeartbeatSample.objects.create(
            broker_id=link.broker_id,
            time=sample_time,
            connections=_count(counts, "connections", "status.counts"),
            consumers=_count(counts, "consumers", "status.counts"),
            queues=_count(counts, "queues", "status.counts"),
            messages_ready=_count(counts, "messages_ready", "status.counts"),
            messages_unacked=_count(counts, "messages_unacked", "status.counts"),
            published_total=_count(totals, "published", "status.totals"),
            routed_total=_count(totals, "routed", "status.totals"),
            delivered_total=_count(totals, "delivered", "status.totals"),
            rate_published=_number(rates, "published", "status.rates"),
            rate_routed=_number(rates, "routed", "status.rates"),
            rate_delivered=_number(rates, "delivered", "status.rates"),
            is_root=bool(view.get("is_root")),
            ready=bool(view.get("ready")),
            peers_active=sum(1 for p in peer_rows if p["active"]),
            peers_known=len(peer_rows),
            peers=peer_rows,
            spid=link.spid,
            root=str(view.get("root") or "")[:64],
        )
        if queues is not None:
            _apply_queues(link, queues, full, now, t)
        if exchanges is not None:
            _apply_exchanges(link.broker_id, exchanges, full, now)
        if bindings is not None:
            _apply_bindings(link.broker_id, bindings, full, now)
        if link.broker_alarms is None:
            link.broker_alarms = alarms.active_broker_alarms(link.broker_id)
        outcome.alarms_changed = alarms.mirror_broker_alarms(
            link.broker_id, reported_alarms, link.broker_alarms
        )
        if running is not None and running != link.running_config:
            # what it runs changed (a reload, an apply): rare, so the few queries are fine
            link.running_config = running
            outcome.config_changed = True
            convergence.check_drift(Broker.objects.get(pk=link.broker_id))
    return outcome


def _running_config(msg: dict[str, Any]) -> tuple[int | None, str] | None:
    """The console configuration a status says the broker runs (None: a broker too old
    to say, whose hello and acks stay the only word on it)."""
    if "config_checksum" not in msg:
        return None
    version = _optional(msg, "config_version", int, "status", None)
    return version, _text(msg, "config_checksum", "status", 64)


def quorum_text(view: dict[str, Any], peers: Sequence[Any], self_primary: bool) -> str:
    """The view's quorum as text: kept if the broker sent text, else described from its peers
    (``self_primary``: the reporting broker is a primary and counts itself)."""
    quorum = view.get("quorum")
    if isinstance(quorum, str):
        return quorum[:255]
    if quorum is None:
        return ""
    primaries = [p for p in peers if isinstance(p, dict) and p.get("type") == "primary"]
    active = sum(1 for p in primaries if p.get("active"))
    known = len(primaries) + self_primary
    active += self_primary
    word = "quorum" if quorum else "no quorum"
    return f"{word} ({active} of {known} primaries active)" if known else word


def _peer(raw: Any, i: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise LinkProtocolError(f"status.view.peers[{i}] must be an object")
    rtt = raw.get("rtt_ms")
    return {
        "spid": str(raw.get("spid") or ""),
        "address": str(raw.get("address") or ""),
        "active": bool(raw.get("active")),
        "rtt_ms": rtt if _is(rtt, (int, float)) else None,
    }


def _broker_alarms(raw: list[Any]) -> list[tuple[str, str, dt.datetime | None]]:
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise LinkProtocolError(f"status.view.alarms[{i}] must be an object with a kind")
        since = item.get("since")
        out.append(
            (
                item["kind"][:64],
                str(item.get("message") or ""),
                epoch(float(since), f"status.view.alarms[{i}].since")
                if _is(since, (int, float))
                else None,
            )
        )
    return out


def _args(entry: dict[str, Any], where: str) -> dict[str, Any]:
    value = entry.get("arguments")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LinkProtocolError(f"{where}.arguments must be an object")
    return value


def _key_text(entry: dict[str, Any], key: str, where: str, required: bool = True) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise LinkProtocolError(f"{where}.{key} must be a string")
    if len(value) > 255:
        raise LinkProtocolError(f"{where}.{key} is longer than 255 characters")
    return value


QUEUE_SNAPSHOT_COLUMNS = (
    "broker",
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


def _apply_queues(
    link: LinkState, section: Section, full: bool, now: dt.datetime, t: float
) -> None:
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
        key = (_key_text(entry, "vhost", where), _key_text(entry, "name", where))
        if key in seen:
            continue  # a broker never sends one twice; if it did, the first wins
        seen.add(key)
        enqueued = _count(entry, "enqueued", where)
        delivered = _count(entry, "delivered", where)
        messages = _count(entry, "messages", where)
        unacked = _count(entry, "unacked", where)
        consumers = _count(entry, "consumers", where)
        rows.append(
            (
                broker_id,
                key[0],
                key[1],
                bool(entry.get("durable")),
                bool(entry.get("exclusive")),
                bool(entry.get("auto_delete")),
                bool(entry.get("shared")),
                messages,
                unacked,
                consumers,
                enqueued,
                delivered,
                json_field.get_db_prep_save(_args(entry, where), connection),
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


def _apply_exchanges(broker_id: int, section: Section, full: bool, now: dt.datetime) -> None:
    rows: dict[tuple[str, str], ExchangeSnapshot] = {}
    for i, entry in enumerate(section.upsert):
        where = f"status.exchanges[{i}]"
        key = (_key_text(entry, "vhost", where), _key_text(entry, "name", where))
        rows.setdefault(
            key,
            ExchangeSnapshot(
                broker_id=broker_id,
                vhost=key[0],
                name=key[1],
                type=_key_text(entry, "type", where)[:64],
                durable=bool(entry.get("durable")),
                auto_delete=bool(entry.get("auto_delete")),
                internal=bool(entry.get("internal")),
                arguments=_args(entry, where),
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
        ["type", "durable", "auto_delete", "internal", "arguments", "updated_at"],
    )


BINDING_KEY = ("vhost", "source", "destination", "destination_type", "routing_key")


def _apply_bindings(broker_id: int, section: Section, full: bool, now: dt.datetime) -> None:
    rows: dict[tuple[str, ...], BindingSnapshot] = {}
    for i, entry in enumerate(section.upsert):
        where = f"status.bindings[{i}]"
        destination_type = _key_text(entry, "destination_type", where)
        if destination_type not in ("queue", "exchange"):
            raise LinkProtocolError(f"{where}.destination_type must be queue or exchange")
        key = (
            _key_text(entry, "vhost", where),
            _key_text(entry, "source", where),
            _key_text(entry, "destination", where),
            destination_type,
            _key_text(entry, "routing_key", where, required=False),
        )
        rows.setdefault(
            key,
            BindingSnapshot(
                broker_id=broker_id,
                **dict(zip(BINDING_KEY, key, strict=True)),
                arguments=_args(entry, where),
                updated_at=now,
            ),
        )
    if full:
        _replace_all(BindingSnapshot, broker_id, BINDING_KEY, rows.keys())
    else:
        _delete_keys(BindingSnapshot, broker_id, BINDING_KEY, section.remove)
    _upsert(
        BindingSnapshot, list(rows.values()), ["broker", *BINDING_KEY], ["arguments", "updated_at"]
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
