"""Queue owners: hand a shared queue to another primary, or spread them all evenly.

A shared quorum or replicated queue has one owner among the primaries, which
holds its messages and copies them to the others; a classic one lives on its
owner alone and cannot move (docs/protocol.md, "Queue types"). Operators move
one queue (``queue.move``) or have the root spread the owners over the primaries
(``queues.rebalance``, as ``rabbitmq-queues rebalance``). Both are commands of the
whole cluster, so they go to one connected primary (the root when it is linked),
which asks the root to order them.

The hand-over completes after the ack, usually within a second: the ack only says
the root accepted it. So nothing here writes an owner: the console shows the new
owner when the brokers' statuses report it, and an ack is recorded in the audit
log as what was requested.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import Q

from clusterapi import audit, commands, objects
from clusterapi.errors import Conflict
from clusterapi.models import AuditEntry, Broker, Command, QueueSnapshot

log = logging.getLogger(__name__)

#: at most this many of a rebalance's moves are kept in its audit entry
AUDITED_MOVES = 100
#: the vhost a rebalance spreads when none is given (the cluster vhost of the quickstart)
DEFAULT_VHOST = "/"


def cluster_primary(cluster: str | None) -> Broker:
    """The broker to send a cluster command to: a primary (of ``cluster``, unless None)
    that is up and linked to the console, the root first (it orders moves itself), else
    the one heard from last. :class:`Conflict` when there is none: a command for a
    broker that is not linked would wait for it, while another could carry it out now."""
    linked = Broker.objects.filter(
        broker_type=Broker.TYPE_PRIMARY, state=Broker.STATE_UP, connected=True
    )
    if cluster is not None:
        linked = linked.filter(cluster=cluster)
    chosen = linked.order_by("-is_root", "-last_seen", "name").first()
    if chosen is None:
        where = f" of cluster {cluster!r}" if cluster else ""
        raise Conflict(
            f"no primary{where} is linked to the console now: none can carry out the command"
        )
    return chosen


def move(queue: QueueSnapshot, to: str, user: Any) -> Command:
    """Ask the cluster to hand ``queue`` (any broker's row of it) to the primary ``to``
    (its spid or its name); audited. :class:`Conflict` when it cannot."""
    if not queue.shared:
        raise Conflict(
            f"queue {queue.name!r} is private to {queue.broker.name}: only a shared queue "
            "has an owner to move"
        )
    broker = cluster_primary(queue.broker.cluster)
    args = {"vhost": queue.vhost, "queue": queue.name, "to": to}
    return commands.issue(broker, Command.QUEUE_MOVE, args, user)


def rebalance(vhost: str, user: Any) -> Command:
    """Ask the cluster to spread the owners of ``vhost``'s shared queues evenly over its
    primaries; audited. :class:`Conflict` when no primary is linked."""
    broker = cluster_primary(None)
    return commands.issue(broker, Command.QUEUES_REBALANCE, {"vhost": vhost}, user)


def move_options(queue: QueueSnapshot) -> dict[str, Any]:
    """What the queue page offers: the primaries the queue can move to (up, of its
    cluster, not its owner), or why it cannot move now (the API would answer 409)."""
    options: dict[str, Any] = {"targets": [], "refusal": ""}
    if not queue.shared:
        options["refusal"] = "a private queue has no owner to move"
        return options
    if queue.kind == "classic":
        options["refusal"] = "a classic queue lives on its owner alone, with no copy to hand over"
        return options
    try:
        cluster_primary(queue.broker.cluster)
    except Conflict as exc:
        options["refusal"] = exc.message
        return options
    targets = Broker.objects.filter(
        cluster=queue.broker.cluster, broker_type=Broker.TYPE_PRIMARY, state=Broker.STATE_UP
    ).exclude(spid="")
    if queue.master:
        targets = targets.exclude(spid=queue.broker.spid)
    options["targets"] = [{"spid": b.spid, "name": b.name} for b in targets.order_by("name")]
    if not options["targets"]:
        options["refusal"] = "no other primary is up to take it"
    return options


def recent_moves(queue: QueueSnapshot, since: Any) -> Any:
    """The queue's moves still on their way or finished since ``since``, newest first."""
    return (
        Command.objects.filter(name=Command.QUEUE_MOVE, args__vhost=queue.vhost)
        .filter(args__queue=queue.name)
        .filter(Q(state__in=Command.OPEN_STATES) | Q(finished_at__gte=since))
        .select_related("broker", "created_by")
    )


def recent_rebalances(since: Any) -> Any:
    """Rebalances still on their way or finished since ``since``, newest first."""
    return (
        Command.objects.filter(name=Command.QUEUES_REBALANCE)
        .filter(Q(state__in=Command.OPEN_STATES) | Q(finished_at__gte=since))
        .select_related("broker", "created_by")
    )


# -- acks: recorded as what the cluster accepted to do, never as an owner -------------------


def _spid(value: Any) -> str | None:
    """A spid from a broker's result, or None for anything else (never trusted blindly)."""
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


def _recorded(action: str, command: Command) -> bool:
    """Whether this command's ack was recorded already (a retried command is acked again)."""
    return AuditEntry.objects.filter(action=action, details__id=str(command.id)).exists()


def _move(raw: Any, names: dict[str, str]) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("queue"), str):
        return None
    source, target = _spid(raw.get("from")), _spid(raw.get("to"))
    return {
        "queue": raw["queue"][: commands.NAME_MAX],
        "from": source,
        "to": target,
        "from_broker": names.get(source or ""),
        "to_broker": names.get(target or ""),
    }


@commands.on_ack(Command.QUEUE_MOVE)
def record_move(command: Command, ok: bool, result: Any, error: str | None) -> None:
    """The root accepted a move: audit which queue goes from which primary to which.
    (A refusal is already audited as ``command.failed`` with the broker's reason.)"""
    if not ok or _recorded("queue.move", command):
        return
    moved = _move(result, objects.spid_names())
    if moved is None:
        log.warning("queue.move %s: acked with an unreadable result %r", command.id, result)
        return
    state = result.get("state")
    details = {
        "id": str(command.id),
        "vhost": command.args.get("vhost"),
        **moved,
        "state": state if isinstance(state, str) else None,
    }
    log.info(
        "queue %s in %s moves from %s to %s (%s)",
        moved["queue"],
        details["vhost"],
        moved["from_broker"] or moved["from"],
        moved["to_broker"] or moved["to"],
        details["state"],
    )
    audit.record(None, "queue.move", command.broker.name, details)


@commands.on_ack(Command.QUEUES_REBALANCE)
def record_rebalance(command: Command, ok: bool, result: Any, error: str | None) -> None:
    """The root planned a rebalance: audit the moves it ordered (none: already even)."""
    if not ok or _recorded("queues.rebalance", command):
        return
    raw = result.get("moves") if isinstance(result, dict) else None
    if not isinstance(raw, list):
        log.warning("queues.rebalance %s: acked with an unreadable result %r", command.id, result)
        return
    names = objects.spid_names()
    moves = [m for m in (_move(item, names) for item in raw) if m is not None]
    log.info("rebalance of %s: %d move(s)", command.args.get("vhost"), len(moves))
    audit.record(
        None,
        "queues.rebalance",
        command.broker.name,
        {
            "id": str(command.id),
            "vhost": command.args.get("vhost"),
            "moves": len(moves),
            "queues": moves[:AUDITED_MOVES],
        },
    )
