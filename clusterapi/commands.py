"""Commands for brokers: issue, deliver (retried), acknowledge, time out.

A command's life: ``pending`` when issued; ``sent`` once pushed down the
broker's link (through the channel layer to the link consumer's group); then
``acked`` or ``failed`` by the broker's ``ack``, or ``timed_out`` at its
deadline. Delivery is repeated every ``COMMAND_RETRY_SECONDS`` until then: the
broker remembers command ids and answers a repeat with its first answer, so
retrying is safe. Every state change is a conditional UPDATE on the open
states, so an ack racing a retry or the timeout sweep never goes backwards.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from brokerd.cluster.config import parse_host
from clusterapi import audit, convergence, objects
from clusterapi.cluster import broker_group, notify_dashboard
from clusterapi.errors import Conflict, InvalidRequest
from clusterapi.models import Broker, Command, ConfigVersion, QueueSnapshot
from clusterapi.scheduling import queue_task

log = logging.getLogger(__name__)

COMMAND_NAMES = tuple(name for name, _ in Command.NAME_CHOICES)
#: commands the cluster carries out as a whole, through whichever primary receives them
CLUSTER_COMMANDS = (Command.QUEUE_MOVE, Command.QUEUES_REBALANCE)
#: commands about a member of the cluster (``{"address": "HOST:PORT"}``), any linked
#: broker of the cluster asks the root for, and what a standalone broker lacks for them
MEMBER_COMMANDS = {
    Command.CLUSTER_FORGET: "cluster members to forget",
    Command.QUEUES_GROW: "quorum groups to grow",
    Command.QUEUES_SHRINK: "quorum groups to shrink",
}
#: the longest vhost, queue or broker name the console stores (its models' max_length)
NAME_MAX = 255
#: a member's address: HOST:PORT, the port in ASCII digits (a link socket is no member)
MEMBER_ADDRESS = re.compile(r"\[?([^\s/\x00\[\]]+?)\]?:([0-9]{1,5})")
#: a retry may come this much before its interval is over (beat's ticks jitter)
RETRY_SLACK = dt.timedelta(milliseconds=250)


def issue(broker: Broker, name: str, args: dict[str, Any] | None, user: Any) -> Command:
    """Record a command for ``broker`` and schedule its delivery (after commit).

    ``config.apply`` takes ``{"version": N}`` (the document and the push serial are
    filled in from that version); ``queue.move`` takes ``{"vhost", "queue", "to"}``
    (``to``: a primary's spid or name, sent as its spid) and ``queues.rebalance``
    ``{"vhost"}``: both go to a primary, which has the root carry them out for the
    whole cluster (``clusterapi.owners`` picks it). ``cluster.forget`` and
    ``queues.grow|shrink`` take ``{"address": "HOST:PORT"}``, the member the root is
    to forget, or to take into or out of the quorum groups (``clusterapi.members``
    picks the broker). The other commands take no
    arguments. A command the broker cannot carry out (see :func:`refusal`) raises
    :class:`Conflict`.
    """
    if not isinstance(broker, Broker) or broker.pk is None:
        raise InvalidRequest("broker: not a known broker")
    if name not in COMMAND_NAMES:
        raise InvalidRequest(
            f"command: unknown command {name!r} (known: {', '.join(COMMAND_NAMES)})"
        )
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidRequest("args: must be an object")
    if name == Command.CONFIG_APPLY:
        args = _config_apply_args(args)
    elif name == Command.QUEUE_MOVE:
        args = _queue_move_args(broker, args)
    elif name == Command.QUEUES_REBALANCE:
        args = _rebalance_args(args)
    elif name in MEMBER_COMMANDS:
        _known_args(name, args, ("address",))
        try:
            args = {"address": member_address(args.get("address"))}
        except ValueError as exc:
            raise InvalidRequest(f"args.address: {exc}") from None
    elif args:
        raise InvalidRequest(f"args: {name} takes no arguments")
    reason = refusal(broker, name, args)
    if reason:
        raise Conflict(reason)
    now = timezone.now()
    creator = audit.known_user(user)
    with transaction.atomic():
        command = Command.objects.create(
            broker=broker,
            name=name,
            args=args,
            created_by=creator,
            deadline=now + dt.timedelta(seconds=settings.COMMAND_TIMEOUT_SECONDS),
        )
        details: dict[str, Any] = {"id": str(command.id)}
        if name == Command.CONFIG_APPLY:
            details["version"] = args["version"]  # never the document: it holds password hashes
        elif name in (*CLUSTER_COMMANDS, *MEMBER_COMMANDS):
            details.update(args)
            if name == Command.QUEUE_MOVE:  # spids change at each restart: say which broker
                target = Broker.objects.filter(spid=args["to"]).values_list("name", flat=True)
                details["to_broker"] = target.first()
        audit.record(user, f"command.{name}", broker.name, details)
        command_id = command.id
        transaction.on_commit(lambda: schedule_delivery(command_id))
        transaction.on_commit(lambda: notify_dashboard("command", broker.name))
    return command


def refusal(broker: Broker, name: str, args: dict[str, Any] | None = None) -> str:
    """Why ``broker`` cannot do command ``name`` now ("" if it can): the dashboard offers
    only what it can, and the API answers 409 with this reason instead of a command
    that would fail or time out. ``args``, validated, let a ``queue.move`` be checked
    against what the brokers last reported of the queue."""
    if name == Command.CONFIG_APPLY:
        return ""  # pushes come from clusterapi.configs, which skips brokers that are down
    if broker.state in Broker.NOT_RUNNING_STATES:
        return f"{broker.name} is {broker.state}: it cannot run {name} until it reports again"
    if name in CLUSTER_COMMANDS:
        if broker.broker_type == Broker.TYPE_SECONDARY:
            return f"{broker.name} is a secondary: {name} goes to a primary"
        if broker.broker_type == Broker.TYPE_STANDALONE:
            return f"{broker.name} is standalone: it has no cluster whose queues could move"
        if not broker.connected:
            return f"{broker.name} is not linked to the console now: it cannot be sent {name}"
        if name == Command.QUEUE_MOVE and args:
            return _move_refusal(broker, args)
    if name in MEMBER_COMMANDS:
        if broker.broker_type == Broker.TYPE_STANDALONE:
            return f"{broker.name} is standalone: it has no {MEMBER_COMMANDS[name]}"
        if not broker.connected:
            return f"{broker.name} is not linked to the console now: it cannot be sent {name}"
    if name in (Command.ROOT_ENABLE, Command.ROOT_DISABLE):
        if broker.broker_type == Broker.TYPE_SECONDARY:
            return f"{broker.name} is a secondary: secondaries are never root"
        if broker.broker_type == Broker.TYPE_STANDALONE:
            return f"{broker.name} is standalone: it has no cluster to be root of"
        if name == Command.ROOT_ENABLE and broker.root_enabled:
            return f"{broker.name} may already be root (root is enabled)"
        if name == Command.ROOT_DISABLE and not broker.root_enabled:
            return f"{broker.name} already abstains from being root (root is disabled)"
    return ""


def _config_apply_args(args: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(args) - {"version", "config"})
    if unknown:
        raise InvalidRequest(f"args.{unknown[0]}: unknown argument (config.apply takes version)")
    number = args.get("version")
    if isinstance(number, bool) or not isinstance(number, int):
        raise InvalidRequest("args.version: must be a configuration version number")
    version = ConfigVersion.objects.filter(number=number).first()
    if version is None:
        raise InvalidRequest(f"args.version: there is no configuration version {number}")
    # the serial orders pushes on the broker, so a version can be pushed again later
    return {"version": version.number, "config": version.document, "serial": version.push_serial}


def _name_arg(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"args.{key}: must be a non-empty string")
    if len(value) > NAME_MAX or "\x00" in value:
        raise InvalidRequest(f"args.{key}: at most {NAME_MAX} characters, without NUL")
    return value


def _known_args(name: str, args: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise InvalidRequest(
            f"args.{unknown[0]}: unknown argument ({name} takes {', '.join(known)})"
        )


def _primary(broker: Broker, to: str) -> Broker:
    """The primary of ``broker``'s cluster that ``to`` names, by spid or by name.

    Not knowing it is a :class:`Conflict`, not a bad request: a spid changes at every
    restart, so a well-formed spid can name a run that is over."""
    target = (
        Broker.objects.filter(Q(spid=to) | Q(name=to), cluster=broker.cluster)
        .exclude(spid="")
        .order_by("-last_seen")
        .first()
    )
    if target is None:
        raise Conflict(
            f"no broker of the cluster is named {to!r} or runs with that spid now "
            "(a spid changes when its broker restarts)"
        )
    if target.broker_type != Broker.TYPE_PRIMARY:
        raise Conflict(f"{target.name} is a {target.broker_type} broker: only primaries own queues")
    return target


def _queue_move_args(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    _known_args(Command.QUEUE_MOVE, args, ("vhost", "queue", "to"))
    vhost, queue, to = (_name_arg(args, key) for key in ("vhost", "queue", "to"))
    return {"vhost": vhost, "queue": queue, "to": _primary(broker, to).spid}


def member_address(value: Any) -> str:
    """A cluster member's address as the brokers name it (``host:port``, the host in
    lower case); ``ValueError`` saying what is wrong with it. Stricter than ``brokerd
    ctl cluster forget``, which takes a bare host as port 5672: the console asks for
    the address its pages show."""
    text = value.strip() if isinstance(value, str) else ""
    match = MEMBER_ADDRESS.fullmatch(text)
    if not text or len(text) > NAME_MAX or match is None:
        raise ValueError(
            f"must be a member's HOST:PORT (e.g. node4.example:5672), at most {NAME_MAX} characters"
        )
    if not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"port {match.group(2)} is out of range (1 to 65535)")
    return str(parse_host(text, "address"))


def _rebalance_args(args: dict[str, Any]) -> dict[str, Any]:
    _known_args(Command.QUEUES_REBALANCE, args, ("vhost",))
    return {"vhost": _name_arg(args, "vhost")}


def _move_refusal(broker: Broker, args: dict[str, Any]) -> str:
    """Why the queue cannot move to ``args["to"]``, from what the brokers last reported
    (the root checks again against its own state, and refuses what changed since)."""
    vhost, queue, to = args["vhost"], args["queue"], args["to"]
    target = Broker.objects.filter(spid=to).first()
    if target is None or target.state != Broker.STATE_UP:
        name = target.name if target is not None else to
        return f"{name} is down: a queue moves only to a primary that is up"
    rows = QueueSnapshot.objects.filter(vhost=vhost, name=queue, broker__cluster=broker.cluster)
    row = rows.filter(shared=True).first()
    if row is None:
        if rows.exists():
            return (
                f"queue {queue!r} in vhost {vhost!r} is private to its broker (exclusive, or "
                "outside the cluster vhost): only a shared queue has an owner to move"
            )
        return f"no broker reports a queue {queue!r} in vhost {vhost!r}"
    shown = objects.representative(row)
    if shown.kind == "classic":
        return (
            f"queue {queue!r} is classic: it lives on its owner alone, with no copy to hand "
            "over (quorum and replicated queues move)"
        )
    if shown.master and shown.broker.spid == to:
        return f"{target.name} already owns queue {queue!r}"
    return ""


def schedule_delivery(command_id: uuid.UUID | str) -> None:
    """Queue the first delivery on Celery; if Celery's broker is unreachable the
    periodic sweep delivers it instead, so never fail the caller."""
    try:
        queue_task("deliver_command", str(command_id))
    except Exception as exc:
        log.warning(
            "command %s: could not queue its delivery (%s); the sweep will", command_id, exc
        )


def deliver(command_id: uuid.UUID | str, now: dt.datetime | None = None) -> bool:
    """Send an open command down its broker's link once; returns whether it was sent.

    Times it out when past its deadline, fails a ``config.apply`` that a newer
    version superseded, and waits (sends nothing) while the broker is not connected.
    """
    now = now or timezone.now()
    command = Command.objects.select_related("broker").filter(pk=command_id).first()
    if command is None or not command.is_open:
        return False
    if now >= command.deadline:
        time_out(command, now)
        return False
    if command.name == Command.CONFIG_APPLY:
        latest = ConfigVersion.objects.current()
        if latest is not None and (
            command.args.get("version") != latest.number
            or command.args.get("serial", latest.push_serial) != latest.push_serial
        ):
            reason = f"superseded by the push of version {latest.number}"
            finish(command, Command.STATE_SUPERSEDED, error=reason)
            notify_dashboard("command", command.broker.name)
            return False
    if not command.broker.connected:
        return False
    retry_after = dt.timedelta(seconds=settings.COMMAND_RETRY_SECONDS) - RETRY_SLACK
    if command.last_attempt_at is not None and now - command.last_attempt_at < retry_after:
        return False  # just sent (by the hello or the first-delivery task)
    updated = Command.objects.filter(pk=command.pk, state__in=Command.OPEN_STATES).update(
        state=Command.STATE_SENT,
        attempts=F("attempts") + 1,
        last_attempt_at=now,
        sent_at=Coalesce(F("sent_at"), Value(now)),
    )
    if not updated:
        return False  # acked meanwhile
    layer = get_channel_layer()
    try:
        async_to_sync(layer.group_send)(
            broker_group(command.broker_id),
            {
                "type": "broker.command",
                "id": str(command.id),
                "command": command.name,
                "args": command.args,
            },
        )
    except Exception as exc:  # Redis down: the attempt is counted, the sweep retries
        log.warning("command %s to %s: channel layer error: %s", command.id, command.broker, exc)
        return False
    if command.attempts == 0:
        notify_dashboard("command", command.broker.name)
    return True


def finish(
    command: Command,
    state: str,
    *,
    result: Any = None,
    error: str = "",
    now: dt.datetime | None = None,
) -> bool:
    """Move an open command to a final state; False if it was already final."""
    now = now or timezone.now()
    done = Command.objects.filter(pk=command.pk, state__in=Command.OPEN_STATES).update(
        state=state, result=result, error=error, finished_at=now
    )
    if done:
        command.state, command.result, command.error, command.finished_at = (
            state,
            result,
            error,
            now,
        )
    return bool(done)


def time_out(command: Command, now: dt.datetime | None = None) -> bool:
    error = f"no acknowledgement before the deadline ({command.attempts} attempt(s))"
    if not finish(command, Command.STATE_TIMED_OUT, error=error, now=now):
        return False
    log.warning("command %s %s to %s timed out", command.id, command.name, command.broker_id)
    audit.record(
        None,
        "command.timed_out",
        command.broker.name,
        {"id": str(command.id), "command": command.name, "attempts": command.attempts},
    )
    notify_dashboard("command", command.broker.name)
    if command.name == Command.CONFIG_APPLY:
        convergence.check_drift(command.broker)  # no push on its way any more
    return True


def sweep(now: dt.datetime | None = None) -> dict[str, int]:
    """Time out expired commands and re-send those due for a retry (Celery beat)."""
    now = now or timezone.now()
    timed_out = 0
    for command in Command.objects.select_related("broker").filter(
        state__in=Command.OPEN_STATES, deadline__lte=now
    ):
        timed_out += time_out(command, now)
    due_before = now - dt.timedelta(seconds=settings.COMMAND_RETRY_SECONDS) + RETRY_SLACK
    due = Command.objects.filter(
        Q(last_attempt_at__isnull=True) | Q(last_attempt_at__lte=due_before),
        state__in=Command.OPEN_STATES,
        deadline__gt=now,
        broker__connected=True,
    ).values_list("pk", flat=True)
    sent = sum(deliver(pk, now) for pk in list(due))
    return {"timed_out": timed_out, "sent": sent}


#: what a command's ack does beyond finishing it, by command name: registered by the
#: module that issues the command (``configs`` for config.apply) with ``on_ack``
AckHandler = Callable[[Command, bool, Any, str | None], None]
_ACK_HANDLERS: dict[str, AckHandler] = {}


def on_ack(name: str) -> Callable[[AckHandler], AckHandler]:
    """Register what an ack of command ``name`` does once the command is finished."""

    def register(handler: AckHandler) -> AckHandler:
        _ACK_HANDLERS[name] = handler
        return handler

    return register


def acknowledge(
    broker_id: int, command_id: str, ok: bool, result: Any, error: str | None
) -> Command | None:
    """Apply a broker's ``ack``: finish the command, record what it changed, audit."""
    try:
        key = uuid.UUID(command_id)
    except (TypeError, ValueError):
        log.warning("broker %s acked %r, which is not a command id", broker_id, command_id)
        return None
    command = Command.objects.select_related("broker").filter(pk=key, broker_id=broker_id).first()
    if command is None:
        log.warning("broker %s acked unknown command %s", broker_id, command_id)
        return None
    state = Command.STATE_ACKED if ok else Command.STATE_FAILED
    with transaction.atomic():
        if finish(command, state, result=result, error="" if ok else (error or "refused")):
            audit.record(
                None,
                f"command.{state}",
                command.broker.name,
                {"id": str(command.id), "command": command.name, "error": command.error},
            )
        else:
            log.info("late ack for %s command %s (%s)", command.state, command.id, state)
        if ok and command.name in (Command.ROOT_ENABLE, Command.ROOT_DISABLE):
            enabled = result.get("root_enabled") if isinstance(result, dict) else None
            if isinstance(enabled, bool):
                Broker.objects.filter(pk=broker_id).update(root_enabled=enabled)
        handler = _ACK_HANDLERS.get(command.name)
        if handler is not None:
            handler(command, ok, result, error)
    notify_dashboard("command", command.broker.name)
    return command
