"""Turning broker-link messages into rows (docs/protocol.md, "Console link").

The link consumer parses each message (``clusterapi.linkparse``) and applies it
here in one transaction. A ``status`` arrives from every broker every heartbeat
(10 brokers x 1,000 queues at 1 Hz is the design load), so applying one costs a
fixed number of queries whatever its size: the broker row is updated with one
UPDATE, the heartbeat sample is one INSERT, the queues, exchanges and bindings a
few bulk statements each, of the rows that changed (``clusterapi.snapshots``).
What the link needs across statuses (last ``seq``, queue counters for rates, the
active broker alarms, the snapshot rows it stored) lives in :class:`LinkState`, so
a status reads nothing back but on a link's first status or when a shared queue
changes master.

Malformed messages raise :class:`LinkProtocolError`; the consumer closes the
socket with code 4400 and the error as the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from clusterapi import alarms, audit, convergence, events, linkparse, snapshots
from clusterapi.linkparse import (
    Hello,
    LinkProtocolError,
    epoch,
    parse_envelope,
    parse_hello,
    parse_stopping,
    quorum_text,
)
from clusterapi.models import Broker, BrokerEvent, HeartbeatSample

__all__ = [
    "Hello",
    "LinkProtocolError",
    "LinkState",
    "StatusOutcome",
    "apply_status",
    "epoch",
    "link_closed",
    "mark_disconnected",
    "parse_envelope",
    "parse_hello",
    "parse_stopping",
    "quorum_text",
    "record_stopping",
    "register_hello",
]

log = logging.getLogger(__name__)

#: statuses whose ``time`` is further than this from the console's clock are
#: sampled at the console's time (a broker with a wrong clock must not scatter charts)
MAX_CLOCK_SKEW = 300.0

QueueKey = tuple[str, str]
#: ``LinkState.running_config`` when the link does not know what the row says
UNKNOWN_RUNNING: tuple[int | None, str] = (None, "?")


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
    #: the broker announced a planned stop: its link closing next is no crash
    stopping: bool = False
    #: a worker of this ``brokerd --workers`` host ("": a broker of its own)
    host: str = ""
    #: the broker's queue, exchange and binding rows as stored, so a status writes only
    #: what changed (None: not read yet; forgotten when a status fails)
    queue_rows: dict[QueueKey, snapshots.StoredRow] | None = None
    exchange_rows: snapshots.WiringRows | None = None
    binding_rows: snapshots.WiringRows | None = None

    def forget_rows(self) -> None:
        """The database may not hold what this link remembers (a status rolled back):
        read it again at the next status."""
        self.queue_rows = self.exchange_rows = self.binding_rows = None


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
        "host": hello.host,
        "worker": hello.worker,
        "host_workers": hello.workers,
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
        # a retired broker that links again is in service again: the cluster file
        # evidently still has it (its audit entry says previous_state "retired")
        "retired_at": None,
        # a new run: what an earlier one ran says nothing (None from an older brokerd)
        "in_force": hello.in_force,
        "in_force_at": now if hello.in_force is not None else None,
    }
    with transaction.atomic():
        broker, created = Broker.objects.get_or_create(name=hello.name, defaults=values)
        previous = None if created else broker.state
        old_spid, old_seen = ("", None) if created else (broker.spid, broker.last_seen)
        if not created:
            for key, value in values.items():
                setattr(broker, key, value)
        broker.state = Broker.STATE_UP
        broker.save()
        if old_spid and old_spid != hello.spid:
            # one row per name: the new run replaces the old one's spid, the event keeps both
            planned = previous == Broker.STATE_STOPPED
            events.record_restart(broker, old_spid, old_seen, planned=planned)
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


# -- stopping and the link closing ----------------------------------------------------------


def record_stopping(link: LinkState, spid: str, reason: str) -> bool:
    """``stopping``: the broker stops as planned (SIGTERM). It is marked stopped (not
    up, so counts follow at once; no down alarm, now or when its link closes) with an
    info event, and its latest heartbeat sample of this run gets ``stopping`` (no
    sample is made up: the traffic report reads the mark from the lake, and tells the
    gap after it from a crash). Returns whether the row changed (not for another run's
    spid, nor for a name another broker owns now)."""
    if spid != link.spid:
        log.warning(
            "broker %s: stopping for spid %s, but this link's run is %s: ignored",
            link.name,
            spid,
            link.spid,
        )
        return False
    why = reason or "no reason given"
    with transaction.atomic():
        if not Broker.objects.filter(pk=link.broker_id, spid=link.spid).update(
            state=Broker.STATE_STOPPED, ready=False, updated_at=timezone.now()
        ):
            return False
        latest = (
            HeartbeatSample.objects.filter(broker_id=link.broker_id, spid=spid)
            .order_by("-time", "-id")
            .values_list("id", flat=True)[:1]
        )
        HeartbeatSample.objects.filter(pk__in=list(latest)).update(stopping=True)
        broker = Broker.objects.get(pk=link.broker_id)
        events.record(
            broker,
            BrokerEvent.KIND_STOPPING,
            f"stopping as planned ({why}): spid {spid}",
            BrokerEvent.LEVEL_INFO,
            {"spid": spid, "reason": reason},
        )
        audit.record(None, "broker.stopping", broker.name, {"spid": spid, "reason": reason})
    link.stopping = True
    return True


def link_closed(link: LinkState, channel_name: str, code: int | None, crash: bool = True) -> str:
    """The link on ``channel_name`` closed; returns what that made of the broker.

    ``"stopped"``: it announced the stop. ``"down"``: it closed without one (a crash,
    ``kill -9``, the network), so the broker is down at once, with the ``broker.down``
    alarm and a warning event, instead of after missed heartbeats. ``"restarting"``:
    the same for a worker of a host, whose host restarts it: a warning event, and
    ``broker.down`` only if it stays silent past ``WORKER_RESTART_GRACE``. ``""``: nothing
    changed beyond ``connected`` (it reconnected on another link meanwhile, it was not
    up, another broker owns the name, or ``crash`` is false: the console closed it).
    """
    with transaction.atomic():
        if not mark_disconnected(link.broker_id, channel_name):
            return ""
        if link.stopping:
            return "stopped"
        if crash and link.host:
            # a worker of a host: its host restarts it within seconds, which its next
            # hello shows as a restart; silence past WORKER_RESTART_GRACE is down
            broker = Broker.objects.get(pk=link.broker_id)
            events.record(
                broker,
                BrokerEvent.KIND_LINK_LOST,
                f"link lost without a planned stop (code {code}): spid {link.spid}; "
                f"a worker of {link.host}, which restarts it",
                BrokerEvent.LEVEL_WARNING,
                {"spid": link.spid, "code": code, "host": link.host},
            )
            return "restarting"
        if not crash or not Broker.objects.filter(
            pk=link.broker_id, spid=link.spid, state=Broker.STATE_UP
        ).update(state=Broker.STATE_DOWN, ready=False, updated_at=timezone.now()):
            return ""
        broker = Broker.objects.get(pk=link.broker_id)
        why = f"its console link closed without a planned stop (code {code})"
        alarms.raise_alarm(alarms.BROKER_DOWN, f"{broker.name} is down: {why}", broker)
        events.record(
            broker,
            BrokerEvent.KIND_LINK_LOST,
            f"link lost without a planned stop (code {code}): spid {link.spid}",
            BrokerEvent.LEVEL_WARNING,
            {"spid": link.spid, "code": code},
        )
        audit.record(None, "broker.down", broker.name, {"spid": link.spid, "why": why})
    return "down"


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
    try:
        return _apply_status(link, msg)
    except BaseException:
        link.forget_rows()  # its transaction rolled back what the link remembers writing
        raise


def _apply_status(link: LinkState, msg: dict[str, Any]) -> StatusOutcome:
    seq = linkparse.require(msg, "seq", int, "status")
    sent = epoch(float(linkparse.require(msg, "time", (int, float), "status")), "status.time")
    full = linkparse.require(msg, "full", bool, "status")
    view = linkparse.optional(msg, "view", dict, "status", {})
    counts = linkparse.optional(msg, "counts", dict, "status", {})
    totals = linkparse.optional(msg, "totals", dict, "status", {})
    rates = linkparse.optional(msg, "rates", dict, "status", {})
    queues = linkparse.section(msg, "queues", full, 2)
    exchanges = linkparse.section(msg, "exchanges", full, 2)
    bindings = linkparse.section(msg, "bindings", full, 5)
    peers = linkparse.optional(view, "peers", list, "status.view", [])
    view["bridges"] = linkparse.bridges(view)  # checked, and stored so (the bridges page)
    reported_alarms = linkparse.broker_alarms(
        linkparse.optional(view, "alarms", list, "status.view", [])
    )
    running = linkparse.running_config(msg)
    in_force = linkparse.parse_in_force(msg, "status")  # only when it changed

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
    peer_rows = [linkparse.peer(p, i) for i, p in enumerate(peers)]

    with transaction.atomic():
        # the row is updated only while this link's broker owns the name (its spid), so
        # the name-conflict check costs a query only when that update matched nothing
        owned = Broker.objects.filter(pk=link.broker_id)
        if link.spid:
            owned = owned.filter(spid=link.spid)
        reported: dict[str, Any] = {}
        if running is not None:
            reported = {"config_version": running[0], "config_checksum": running[1]}
        if in_force is not None:
            reported.update(in_force=in_force, in_force_at=now)
            outcome.config_changed = True
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
        # (a status after ``stopping`` leaves the broker stopped: it is on its way out)
        if not link.stopping and (
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
            connections=linkparse.count(counts, "connections", "status.counts"),
            consumers=linkparse.count(counts, "consumers", "status.counts"),
            queues=linkparse.count(counts, "queues", "status.counts"),
            messages_ready=linkparse.count(counts, "messages_ready", "status.counts"),
            messages_unacked=linkparse.count(counts, "messages_unacked", "status.counts"),
            published_total=linkparse.count(totals, "published", "status.totals"),
            routed_total=linkparse.count(totals, "routed", "status.totals"),
            delivered_total=linkparse.count(totals, "delivered", "status.totals"),
            bridged_total=linkparse.count(totals, "bridged", "status.totals"),
            rate_published=linkparse.number(rates, "published", "status.rates"),
            rate_routed=linkparse.number(rates, "routed", "status.rates"),
            rate_delivered=linkparse.number(rates, "delivered", "status.rates"),
            is_root=bool(view.get("is_root")),
            ready=bool(view.get("ready")),
            peers_active=sum(1 for p in peer_rows if p["active"]),
            peers_known=len(peer_rows),
            peers=peer_rows,
            spid=link.spid,
            root=str(view.get("root") or "")[:64],
        )
        if queues is not None:
            snapshots.apply_queues(link, queues, full, now, t)
        if exchanges is not None:
            snapshots.apply_exchanges(link, exchanges, full, now)
        if bindings is not None:
            snapshots.apply_bindings(link, bindings, full, now)
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
