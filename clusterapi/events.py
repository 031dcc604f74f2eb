"""Broker events: what happened to a broker, kept for its page and for history.

A restart is seen at ``hello``: the same name with a new spid. The broker stays one
row (identified by its name); the event keeps the old and the new spid and, when the
console heard the old run, the downtime between its last message and the new run's
start.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.utils import timezone

from clusterapi.models import Broker, BrokerEvent

log = logging.getLogger(__name__)

#: events shown on a broker's page
SHOWN = 10


def record(
    broker: Broker,
    kind: str,
    message: str,
    level: str = BrokerEvent.LEVEL_INFO,
    details: dict[str, Any] | None = None,
    when: dt.datetime | None = None,
) -> BrokerEvent:
    event = BrokerEvent.objects.create(
        broker=broker,
        time=when or timezone.now(),
        kind=kind,
        level=level,
        message=message,
        details=details or {},
    )
    log.log(
        logging.INFO if level == BrokerEvent.LEVEL_INFO else logging.WARNING,
        "broker %s: %s",
        broker.name,
        message,
    )
    return event


def downtime(last_seen: dt.datetime | None, started: dt.datetime | None) -> float | None:
    """Seconds from the old run's last message to the new run's start, if both are known
    (never negative: the clocks of the broker and the console differ a little)."""
    if last_seen is None or started is None:
        return None
    return round(max(0.0, (started - last_seen).total_seconds()), 3)


def record_restart(
    broker: Broker,
    old_spid: str,
    last_seen: dt.datetime | None,
    planned: bool,
) -> BrokerEvent:
    """A new spid at ``broker``'s name: info after a planned stop, else a warning."""
    gap = downtime(last_seen, broker.start_time)
    how = "after a planned stop" if planned else "without a planned stop"
    took = f", down {gap:g} s" if gap is not None else ""
    return record(
        broker,
        BrokerEvent.KIND_RESTART,
        f"restarted {how}: spid {old_spid} -> {broker.spid}{took}",
        BrokerEvent.LEVEL_INFO if planned else BrokerEvent.LEVEL_WARNING,
        {
            "old_spid": old_spid,
            "new_spid": broker.spid,
            "downtime_seconds": gap,
            "planned": planned,
        },
    )
