"""Raising and clearing alarms.

An alarm is identified by (broker, kind, source) while it is active: raising it
again refreshes its message instead of piling up rows, and clearing it keeps
the row (``active=False``, ``cleared_at``) as history. Broker-raised alarms
(``view.alarms`` in a status) are mirrored with ``source=broker``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from clusterapi import audit
from clusterapi.errors import Conflict, InvalidRequest
from clusterapi.models import Alarm, Broker

log = logging.getLogger(__name__)

BROKER_DOWN = "broker.down"
LINK_REFUSED = "link.refused"
CONFIG_FAILED = "config.failed"
CONFIG_DRIFT = "config.drift"
NAME_CONFLICT = "broker.name_conflict"


def raise_alarm(
    kind: str,
    message: str,
    broker: Broker | None = None,
    source: str = Alarm.SOURCE_CONSOLE,
    raised_at: dt.datetime | None = None,
) -> tuple[Alarm, bool]:
    """Raise (or refresh) an alarm; returns it and whether it is new."""
    existing = Alarm.objects.filter(broker=broker, kind=kind, source=source, active=True).first()
    if existing is not None:
        existing.message = message
        existing.save(update_fields=["message", "updated_at"])
        return existing, False
    alarm = Alarm.objects.create(
        broker=broker,
        kind=kind,
        message=message,
        source=source,
        raised_at=raised_at or timezone.now(),
    )
    log.warning("alarm raised: %s%s: %s", kind, f" on {broker.name}" if broker else "", message)
    return alarm, True


def clear_alarm(kind: str, broker: Broker | None = None, source: str = Alarm.SOURCE_CONSOLE) -> int:
    """Clear the active alarm(s) of that kind; returns how many were cleared."""
    cleared = Alarm.objects.filter(broker=broker, kind=kind, source=source, active=True).update(
        active=False, cleared_at=timezone.now(), updated_at=timezone.now()
    )
    if cleared:
        log.info("alarm cleared: %s%s", kind, f" on {broker.name}" if broker else "")
    return cleared


def clear_stale(kind: str, older_than: dt.datetime) -> int:
    """Clear alarms of ``kind`` not raised again since ``older_than`` (e.g. refused links)."""
    now = timezone.now()
    return Alarm.objects.filter(kind=kind, active=True, updated_at__lt=older_than).update(
        active=False, cleared_at=now, updated_at=now
    )


def mirror_broker_alarms(
    broker_id: int,
    reported: Iterable[tuple[str, str, dt.datetime | None]],
    active: dict[str, str],
) -> bool:
    """Make the broker-source alarms of one broker match its ``view.alarms``.

    ``reported`` is (kind, message, since); ``active`` is the caller's cache of
    kind -> message of what is active now, updated in place. Returns whether
    anything changed. Costs no query when nothing did.
    """
    now = timezone.now()
    wanted = {kind: (message, since) for kind, message, since in reported}
    changed = False
    gone = [kind for kind in active if kind not in wanted]
    if gone:
        Alarm.objects.filter(
            broker_id=broker_id, source=Alarm.SOURCE_BROKER, active=True, kind__in=gone
        ).update(active=False, cleared_at=now, updated_at=now)
        for kind in gone:
            del active[kind]
        changed = True
    for kind, (message, since) in wanted.items():
        if kind not in active:
            Alarm.objects.create(
                broker_id=broker_id,
                kind=kind,
                message=message,
                source=Alarm.SOURCE_BROKER,
                raised_at=since or now,
            )
            changed = True
        elif active[kind] != message:
            Alarm.objects.filter(
                broker_id=broker_id, source=Alarm.SOURCE_BROKER, active=True, kind=kind
            ).update(message=message, updated_at=now)
            changed = True
        active[kind] = message
    return changed


def active_broker_alarms(broker_id: int) -> dict[str, str]:
    """kind -> message of a broker's active broker-raised alarms (the cache's first fill)."""
    return dict(
        Alarm.objects.filter(
            broker_id=broker_id, source=Alarm.SOURCE_BROKER, active=True
        ).values_list("kind", "message")
    )


def acknowledge(alarm: Alarm, user: Any, comment: str = "") -> Alarm:
    """An operator has seen ``alarm``: record who, when and their note, and audit it.

    Only an active alarm that nobody acknowledged yet can be (``Conflict`` otherwise):
    a cleared alarm needs nobody's attention, and a second acknowledgement would
    overwrite who saw it first.
    """
    if len(comment) > 500:
        raise InvalidRequest("comment: at most 500 characters")
    if not alarm.active:
        raise Conflict(f"alarm {alarm.pk} ({alarm.kind}) is cleared: nothing to acknowledge")
    if alarm.acknowledged_at is not None:
        raise Conflict(
            f"alarm {alarm.pk} ({alarm.kind}) was acknowledged by "
            f"{alarm.acknowledged_by_name or 'someone'} already"
        )
    known = audit.known_user(user)
    now = timezone.now()
    updated = Alarm.objects.filter(pk=alarm.pk, active=True, acknowledged_at=None).update(
        acknowledged_at=now,
        acknowledged_by=known,
        acknowledged_by_name=known.get_username() if known is not None else "",
        acknowledgement=comment,
        updated_at=now,
    )
    if not updated:  # cleared or acknowledged in the meantime
        alarm.refresh_from_db()
        return acknowledge(alarm, user, comment)
    alarm.refresh_from_db()
    where = alarm.broker.name if alarm.broker_id else "cluster"
    audit.record(
        user,
        "alarm.acknowledge",
        f"{alarm.kind} on {where}",
        {"alarm": alarm.pk, "kind": alarm.kind, "comment": comment},
    )
    log.info("alarm %s (%s) acknowledged by %s", alarm.pk, alarm.kind, alarm.acknowledged_by_name)
    return alarm
