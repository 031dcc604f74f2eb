"""Quorum groups that follow the members (issue 43), from the console: a running
primary joins every quorum group that leaves it out (``queues.grow``) or leaves
every group that names it (``queues.shrink``), as ``brokerd ctl queues
grow|shrink HOST:PORT`` do on a server.

The command goes to a linked broker of the cluster, the root first, the way a
forget does (``clusterapi.members``): that broker asks the root queue by queue
and acks with each queue's answer, its new group or the root's reason (a group
of two does not shrink, the owner does not leave its group, a queue moving is
left alone). The Members section follows the command live; the API waits for
its ack.
"""

from __future__ import annotations

import logging
from typing import Any

from clusterapi import audit, commands, members
from clusterapi.errors import InvalidRequest
from clusterapi.models import AuditEntry, Command

log = logging.getLogger(__name__)

#: the action an operator asks for, and its command
ACTIONS = {"grow": Command.QUEUES_GROW, "shrink": Command.QUEUES_SHRINK}
#: the broker waits up to 15 s for the root's answer on each queue, all asked at once:
#: the API waits a little longer for its ack
WAIT_SECONDS = 40.0
#: queue rows read of an ack at most (its result is the broker's word)
QUEUE_ROWS_MAX = 10_000


def command_name(action: Any) -> str:
    """The command for ``action`` ("grow" or "shrink"); :class:`InvalidRequest` else."""
    if not isinstance(action, str) or action not in ACTIONS:
        raise InvalidRequest("action: must be grow or shrink")
    return ACTIONS[action]


def change(action: Any, address: Any, user: Any) -> Command:
    """Ask the cluster to take the primary at ``address`` into (``grow``) or out of
    (``shrink``) the quorum groups: the command to a linked broker, the root first;
    audited. :class:`InvalidRequest` for a bad action or address,
    :class:`Unavailable` when no broker of a cluster is linked."""
    return members.send(command_name(action), address, user)


def change_and_wait(action: Any, address: Any, user: Any, seconds: float | None = None) -> Command:
    """:func:`change`, then the broker's answer (``members.send_and_wait``): the acked
    command, :class:`Conflict` when the broker refused it as a whole,
    :class:`NoAnswer` past ``seconds`` (``WAIT_SECONDS``)."""
    name = command_name(action)
    return members.send_and_wait(name, address, user, WAIT_SECONDS if seconds is None else seconds)


def outcome(result: Any) -> list[dict[str, Any]]:
    """An ack's per-queue answers, read field by field: ``{queue, changed, group,
    reason}``; rows without a queue name are left out."""
    rows = result.get("queues") if isinstance(result, dict) else None
    out = []
    for row in rows[:QUEUE_ROWS_MAX] if isinstance(rows, list) else []:
        if not isinstance(row, dict) or not members.text(row.get("queue")):
            continue
        group = row.get("group")
        out.append(
            {
                "queue": members.text(row["queue"]),
                "changed": row.get("changed") is True,
                "group": [members.text(a) for a in group if isinstance(a, str)][: members.ROWS_MAX]
                if isinstance(group, list)
                else [],
                "reason": members.text(row.get("reason"), 1000),
            }
        )
    return out


@commands.on_ack(Command.QUEUES_GROW)
@commands.on_ack(Command.QUEUES_SHRINK)
def record_change(command: Command, ok: bool, result: Any, error: str | None) -> None:
    """The root changed groups: audit which queues (the command's own entry says who
    asked)."""
    if not ok:
        return
    action = "queues.grown" if command.name == Command.QUEUES_GROW else "queues.shrunk"
    done = AuditEntry.objects.filter(action=action, details__id=str(command.id))
    if done.exists():  # a retried command is acked again
        return
    rows = outcome(result)
    changed = [r["queue"] for r in rows if r["changed"]]
    address = str(command.args.get("address", ""))
    log.warning("%s %s: %d of %d queues", action, address, len(changed), len(rows))
    audit.record(
        None,
        action,
        address,
        {"id": str(command.id), "changed": changed[:100], "refused": len(rows) - len(changed)},
    )
