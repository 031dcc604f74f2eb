"""Retiring a broker that is gone for good (issue 25).

The cluster file on every server is the authority on membership: the console can
only stop *showing* a server. Retiring keeps the row (state ``retired``: its samples,
commands and audit entries stay history) and takes it out of the lists and counts,
closes its alarms, and tells the operator what to edit so that the servers forget it
too. A broker that links again under the same name is active again
(``ingest.register_hello``), since the cluster file evidently still has it.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from clusterapi import audit
from clusterapi.cluster import notify_dashboard
from clusterapi.errors import Conflict, InvalidRequest
from clusterapi.models import Alarm, Broker, ConfigVersion

#: how a ``make run`` user reaches one of its processes (deploy/quickstart.py ctl)
MAKE_RUN_CTL = ".venv/bin/python deploy/quickstart.py ctl"


def refusal(broker: Broker) -> str:
    """Why this broker cannot be retired now ("" when it can): the dashboard hides the
    button and the API answers 409 with the same words."""
    if broker.state == Broker.STATE_RETIRED:
        return f"{broker.name} is retired already"
    if broker.connected or broker.state == Broker.STATE_UP:
        return (
            f"{broker.name} is linked to the console and up: stop brokerd on it first "
            "(a running broker would only come back with its next hello; under make run, "
            f"{MAKE_RUN_CTL} stop NAME stops one and keeps it stopped, {MAKE_RUN_CTL} "
            "status lists the names)"
        )
    return ""


def advice(broker: Broker) -> list[str]:
    """What the operator must still do so the servers forget it, in order. A primary
    is in every server's known_hosts; a secondary is in none (it links to the
    primaries from its own cluster file), so nothing lists it but its own server;
    a standalone broker belongs to no cluster."""
    if broker.broker_type == Broker.TYPE_SECONDARY:
        steps = [
            f"{broker.name} is a secondary: no server's known_hosts lists it (it linked "
            "to the primaries from its own cluster file), so no cluster file needs editing.",
            f"Make sure brokerd stays stopped on {broker.name}, or remove its cluster "
            "file there: a secondary that starts again links to the primaries again.",
            "The primaries keep no list of secondaries: each shows it as an inactive "
            "peer until that primary next restarts, and then forgets it.",
        ]
    elif broker.broker_type == Broker.TYPE_STANDALONE:
        steps = [
            f"{broker.name} ran standalone: no cluster file names it. Make sure brokerd "
            "stays stopped there, or remove its --console setting."
        ]
    else:
        steps = [
            f"Remove {broker.name} from known_hosts in the cluster file on every server "
            "(the cluster file is the authority on membership; the console cannot edit it).",
            "Then restart the servers one at a time, so that each reads the new list; "
            "the others keep the cluster running meanwhile.",
        ]
        current = ConfigVersion.objects.current()
        hosts = (current.document or {}).get("known_hosts") if current is not None else None
        if isinstance(hosts, list) and broker.name in hosts:
            steps.insert(
                1,
                f"The console's configuration version {current.number} also lists "
                f"{broker.name} in known_hosts: save and push a version without it.",
            )
    steps.append(
        f"Under make run: a broker stopped with SIGTERM, or with {MAKE_RUN_CTL} stop NAME "
        f"({MAKE_RUN_CTL} status lists the names), stays stopped until {MAKE_RUN_CTL} "
        "start NAME: leave it stopped. The next make run starts all its brokers again, "
        "with the cluster file it writes."
    )
    steps.append(
        "Do not start a broker with that name again unless it rejoins: if it links to the "
        "console, it shows as an active broker again."
    )
    return steps


def retire(broker: Broker, user: Any, confirm: str) -> dict[str, Any]:
    """Retire ``broker`` (``confirm`` must be its name); audited. Returns the advice and
    what changed. ``InvalidRequest`` for a wrong confirmation, ``Conflict`` for a broker
    that cannot be retired now (:func:`refusal`)."""
    if confirm != broker.name:
        raise InvalidRequest(f"confirm: type the broker's name, {broker.name}, to retire it")
    now = timezone.now()
    with transaction.atomic():
        why = refusal(Broker.objects.select_for_update().get(pk=broker.pk))
        if why:
            raise Conflict(why)
        closed = Alarm.objects.filter(broker=broker, active=True).update(
            active=False, cleared_at=now
        )
        Broker.objects.filter(pk=broker.pk).update(
            state=Broker.STATE_RETIRED,
            retired_at=now,
            connected=False,
            ready=False,
            is_root=False,
            updated_at=now,
        )
        steps = advice(broker)
        audit.record(
            user,
            "broker.retire",
            broker.name,
            {"spid": broker.spid, "address": broker.address, "alarms_closed": closed},
        )
        notify_dashboard("broker", broker.name)
        notify_dashboard("alarm", broker.name)
    broker.refresh_from_db()
    return {"broker": broker.name, "retired_at": now, "alarms_closed": closed, "next": steps}
