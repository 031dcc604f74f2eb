"""The cluster's members as the console shows them, and the commands about one (issue 43).

The members are replicated state inside brokerd (``brokerd ctl cluster
members``): every clustered broker's status carries its table as
``view.members`` (docs/protocol.md, "Broker to console"), stored with the
broker's last status. The console shows the root's, or when no root is linked
the freshest one; the table is the broker's word, so it is read field by field
and anything malformed is left out rather than shown.

Forgetting a stopped member is the ``cluster.forget`` command (audited, retried
like any other) sent to a linked broker, the root first: that broker asks the
root and acks once a majority of the remaining members holds the new set, or
with the root's refusal. The dashboard follows the command live; the API waits
for its ack (:func:`forget_and_wait`). ``clusterapi.groups`` sends its
``queues.grow|shrink`` the same way (:func:`send`, :func:`send_and_wait`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from django.db.models import Q
from django.utils import timezone

from clusterapi import audit, commands
from clusterapi.errors import Conflict, InvalidRequest, NoAnswer, Unavailable
from clusterapi.models import AuditEntry, Broker, Command

log = logging.getLogger(__name__)

#: states of a member that is not running: the ones that may be forgotten
FORGETTABLE = ("down", "gone", "never heard")
#: states of a member that runs (``self``: the broker reporting the table)
RUNNING = ("self", "up")
#: every state ``brokerd ctl cluster members`` gives (any other shows as ``unknown``)
STATES = (*RUNNING, *FORGETTABLE)
#: rows of a table read at most: a cluster has a few members, this bounds a bad status
ROWS_MAX = 256
#: the broker waits up to 15 s for the root, then up to 15 s for a majority: the API
#: waits a little longer for its ack
FORGET_WAIT_SECONDS = 40.0
POLL_SECONDS = 0.2


def text(value: Any, limit: int = commands.NAME_MAX) -> str:
    return value[:limit] if isinstance(value, str) else ""


def count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


def parse(raw: Any) -> dict[str, Any] | None:
    """A status's members table, checked field by field: rows without an address are
    dropped, strings are cut to length, a state the console does not know is
    ``unknown`` (never forgettable). None when there is no readable table."""
    if not isinstance(raw, dict):
        return None
    version = count(raw.get("version"))
    rows = raw.get("members")
    if version is None or not isinstance(rows, list):
        return None
    members = []
    for row in rows[:ROWS_MAX]:
        if not isinstance(row, dict) or not text(row.get("address")):
            continue
        state = row.get("state") if row.get("state") in STATES else "unknown"
        members.append(
            {
                "address": text(row["address"]),
                "spid": text(row.get("spid"), 64) or None,
                "type": text(row.get("type"), 16),
                "state": state,
                "root": row.get("root") is True,
                "forgettable": state in FORGETTABLE,
                # a running primary: it may join or leave quorum groups (queues.grow|shrink)
                "regroupable": state in RUNNING and row.get("type") == "primary",
            }
        )
    forgotten = raw.get("forgotten")
    return {
        "version": version,
        "term": count(raw.get("term")) or 0,
        "committed": raw.get("committed") is True,
        "joining": raw.get("joining") is True,
        "node": text(raw.get("node"), 64),
        "checksum": text(raw.get("checksum"), 64),
        "root": text(raw.get("root"), 64) or None,
        "members": members,
        "forgotten": [
            {"address": text(f["address"]), "node": text(f.get("node"), 64)}
            for f in (forgotten[:ROWS_MAX] if isinstance(forgotten, list) else [])
            if isinstance(f, dict) and text(f.get("address"))
        ],
    }


def _linked() -> Any:
    """Brokers of a cluster that are up and linked to the console: the root first, then
    primaries ("primary" sorts before "secondary"), the most recently heard first."""
    return (
        Broker.objects.filter(state=Broker.STATE_UP, connected=True)
        .exclude(broker_type=Broker.TYPE_STANDALONE)
        .order_by("-is_root", "broker_type", "-last_seen", "name")
    )


def table() -> dict[str, Any]:
    """The members as the root reports them (or, without a linked root, the linked
    broker heard from last), with which broker said so and when. :class:`Unavailable`
    when no linked broker reports them."""
    for broker in _linked()[:20]:
        parsed = parse((broker.view or {}).get("members"))
        if parsed is not None:
            return {"source": broker.name, "reported_at": broker.last_seen, **parsed}
    if not _linked().exists():
        raise Unavailable(
            "no broker of a cluster is linked to the console now: the members are known "
            "from their statuses"
        )
    raise Unavailable(
        "no linked broker reports the cluster's members (brokerd from before issue 43 "
        "does not): upgrade them, or run 'brokerd ctl cluster members' on a server"
    )


def shown() -> dict[str, Any]:
    """The overview's Members section: :func:`table`, each member marked ``known`` when
    a broker of that name links to the console (its page exists); without a table,
    ``why`` says what is missing."""
    try:
        members = table()
    except Unavailable as exc:
        return {"why": exc.message, "members": [], "forgotten": []}
    addresses = [m["address"] for m in members["members"]]
    known = set(Broker.objects.filter(name__in=addresses).values_list("name", flat=True))
    for row in members["members"]:
        row["known"] = row["address"] in known
    members["why"] = ""
    return members


def send(name: str, address: Any, user: Any) -> Command:
    """Command ``name`` about the member at ``address`` (``HOST:PORT``; one of
    ``commands.MEMBER_COMMANDS``) to a linked broker of the cluster, the root first,
    which asks the root; audited. :class:`InvalidRequest` for a malformed address,
    :class:`Unavailable` when no broker of a cluster is linked."""
    try:
        normalised = commands.member_address(address)
    except ValueError as exc:
        raise InvalidRequest(f"address: {exc}") from None
    broker = _linked().first()
    if broker is None:
        raise Unavailable(
            f"no broker of a cluster is linked to the console now: none can ask the root for {name}"
        )
    return commands.issue(broker, name, {"address": normalised}, user)


def forget(address: Any, user: Any) -> Command:
    """Ask the cluster to forget the stopped member at ``address``: :func:`send` of
    ``cluster.forget``."""
    return send(Command.CLUSTER_FORGET, address, user)


def wait(command: Command, seconds: float) -> Command:
    """The command once it is final, or as it is after ``seconds`` (its broker acks a
    forget only once a majority holds the new set)."""
    deadline = time.monotonic() + seconds
    while True:
        current = Command.objects.select_related("broker").get(pk=command.pk)
        if current.state in Command.FINAL_STATES or time.monotonic() >= deadline:
            return current
        time.sleep(POLL_SECONDS)


def send_and_wait(name: str, address: Any, user: Any, seconds: float) -> Command:
    """:func:`send`, then the broker's answer: the acked command, :class:`Conflict`
    with the root's (or the broker's) reason when refused, :class:`NoAnswer` when it
    did not answer within ``seconds`` (the command stays open, and the broker may
    still carry it out)."""
    command = wait(send(name, address, user), seconds)
    if command.state == Command.STATE_ACKED:
        return command
    if command.state == Command.STATE_FAILED:
        raise Conflict(command.error or f"the broker refused {name}")
    raise NoAnswer(
        f"{command.broker.name} did not answer {name} {command.id} within "
        f"{seconds:g} s ({command.state}): see /api/v1/commands/{command.id}/"
    )


def forget_and_wait(address: Any, user: Any, seconds: float | None = None) -> Command:
    """:func:`send_and_wait` of ``cluster.forget``, up to ``FORGET_WAIT_SECONDS``."""
    if seconds is None:
        seconds = FORGET_WAIT_SECONDS
    return send_and_wait(Command.CLUSTER_FORGET, address, user, seconds)


#: a finished forget, grow or shrink stays in the Members section this long
BANNER_SECONDS = 120
#: commands the Members section shows at most
BANNER_MAX = 5


def recent_commands() -> list[Command]:
    """Forgets, grows and shrinks still on their way, and those that ended in the last
    two minutes: the Members section follows each to its outcome (the refusal's text
    included)."""
    since = timezone.now() - dt.timedelta(seconds=BANNER_SECONDS)
    return list(
        Command.objects.filter(name__in=commands.MEMBER_COMMANDS)
        .filter(Q(state__in=Command.OPEN_STATES) | Q(finished_at__gte=since))
        .select_related("broker", "created_by")[:BANNER_MAX]
    )


@commands.on_ack(Command.CLUSTER_FORGET)
def record_forget(command: Command, ok: bool, result: Any, error: str | None) -> None:
    """The root forgot a member: audit what the cluster did (the members' version, and
    whether a majority held it when the broker answered)."""
    if not ok or not isinstance(result, dict):
        return
    done = AuditEntry.objects.filter(action="cluster.forgotten", details__id=str(command.id))
    if done.exists():  # a retried command is acked again
        return
    version = count(result.get("version"))
    log.warning("cluster forgot %s: members version %s", command.args.get("address"), version)
    audit.record(
        None,
        "cluster.forgotten",
        text(result.get("forgotten")) or str(command.args.get("address", "")),
        {"id": str(command.id), "version": version, "committed": result.get("committed") is True},
    )
