"""The cluster as a whole, from what the brokers last reported; live-update fan-out."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusterapi import alarms, audit, presence
from clusterapi.models import Alarm, Broker, ConfigVersion, HeartbeatSample, QueueSample

log = logging.getLogger(__name__)

#: the group every live browser page joins; its consumers re-render, throttled
DASHBOARD_GROUP = "dashboard"


def broker_group(broker_id: int) -> str:
    """The channel-layer group of one broker's link (commands are sent to it)."""
    return f"broker.{broker_id}"


def dashboard_event(what: str, broker: str | None = None) -> dict[str, Any]:
    return {"type": "dashboard.changed", "what": what, "broker": broker}


def notify_dashboard(what: str, broker: str | None = None) -> None:
    """Tell live pages that ``what`` (broker|command|alarm|config) changed; from sync code.

    Sent once the current transaction commits (at once outside one), so pages
    never re-read before the change is visible. Best effort: a channel layer
    that is down must not fail the ingest or the command that changed something.
    """
    transaction.on_commit(lambda: _send(what, broker))


def _send(what: str, broker: str | None) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(DASHBOARD_GROUP, dashboard_event(what, broker))
    except Exception as exc:  # the channel layer (Redis) is down or unreachable
        log.warning("dashboard notification %s failed: %s", what, exc)


async def keep_in_group(layer: Any, group: str, channel: str) -> None:
    """Re-join ``group`` every ``GROUP_REFRESH_SECONDS`` for as long as the consumer
    lives: memberships expire (``CHANNEL_GROUP_EXPIRY``), so the channels a stopped
    console process left in a group go, and live ones stay."""
    while True:
        await asyncio.sleep(settings.GROUP_REFRESH_SECONDS)
        try:
            await layer.group_add(group, channel)
        except Exception as exc:  # Redis away: try again next time
            log.warning("could not renew %s in group %s: %s", channel, group, exc)


async def anotify_dashboard(what: str, broker: str | None = None) -> None:
    """:func:`notify_dashboard` for async code (the broker link consumer)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(DASHBOARD_GROUP, dashboard_event(what, broker))
    except Exception as exc:
        log.warning("dashboard notification %s failed: %s", what, exc)


def root_broker() -> Broker | None:
    """The up broker that reports itself root (the most recently heard if two do briefly)."""
    return Broker.objects.filter(state=Broker.STATE_UP, is_root=True).order_by("-last_seen").first()


def state() -> dict[str, Any]:
    """Root, readiness, quorum, broker counts, configuration version and active alarms."""
    root = root_broker()
    if root is not None:
        ready, quorum = root.ready, root.quorum
    else:
        # No root: the cluster is not ready; show the quorum as some up broker sees it.
        seen = Broker.objects.filter(state=Broker.STATE_UP).order_by("-last_seen").first()
        ready, quorum = False, (seen.quorum if seen is not None else "")
    latest = ConfigVersion.objects.current()
    active = Alarm.objects.filter(active=True)
    return {
        # brokers of a cluster link here (primaries, secondaries); else only standalone
        # brokers or a brokerd --workers host's workers do, and there is no root to have
        "clustered": root is not None
        or Broker.objects.active().exclude(broker_type=Broker.TYPE_STANDALONE).exists(),
        "root": {"name": root.name, "spid": root.spid} if root is not None else None,
        "ready": ready,
        "quorum": quorum,
        "brokers_up": Broker.objects.filter(state=Broker.STATE_UP).count(),
        "brokers_total": Broker.objects.active().count(),
        "config_version": latest.number if latest is not None else None,
        "alarms_active": active.count(),
        "alarms_unacknowledged": active.filter(acknowledged_at=None).count(),
    }


def detect_stale(now: dt.datetime | None = None) -> list[str]:
    """Mark down every up broker silent for ``BROKER_STALE_INTERVALS`` heartbeats
    while a console was there to hear it (Celery beat, every ``STALE_CHECK_SECONDS``);
    returns their names.

    A silence counts only while a console process beats (``presence.hearing``): a
    console restart is not an outage of every broker. A broker last heard before the
    console (re)started, or before another console process stopped, first gets
    ``BROKER_RECONNECT_GRACE`` seconds to link again; one that does not (it died while
    the console was away) is reported then, with the time it was last heard. The
    broker comes back up with its next hello or status, which clears the alarm.
    """
    now = now or timezone.now()
    heard = presence.hearing(now)
    down = []
    for broker in Broker.objects.filter(state=Broker.STATE_UP) if heard.live else ():
        silent = _silence(broker, heard, now)
        if silent is None:
            continue
        with transaction.atomic():
            # conditional on last_seen: a status that just arrived wins; a broker that is
            # not heard is not ready, whatever it said last
            if not Broker.objects.filter(
                pk=broker.pk, state=Broker.STATE_UP, last_seen=broker.last_seen
            ).update(state=Broker.STATE_DOWN, ready=False):
                continue
            alarms.raise_alarm(
                alarms.BROKER_DOWN,
                f"{broker.name} is down: {silent} "
                f"(heartbeat every {broker.heartbeat_interval:g} s)",
                broker,
            )
            audit.record(None, "broker.down", broker.name, {"spid": broker.spid, "why": silent})
            notify_dashboard("broker", broker.name)
            notify_dashboard("alarm", broker.name)
        down.append(broker.name)
    for kind, quiet in (
        (alarms.LINK_REFUSED, LINK_REFUSED_CLEAR_SECONDS),
        (alarms.NAME_CONFLICT, NAME_CONFLICT_CLEAR_SECONDS),
    ):
        alarms.clear_stale(kind, now - dt.timedelta(seconds=quiet))
    return down


def _silence(broker: Broker, heard: presence.Hearing, now: dt.datetime) -> str | None:
    """Why ``broker`` counts as down now, or None while its silence proves nothing."""
    seconds = max(settings.BROKER_STALE_INTERVALS * broker.heartbeat_interval, STALE_FLOOR)
    if broker.host and not broker.connected:
        seconds = max(seconds, WORKER_RESTART_GRACE)  # its host is restarting it
    allowed = dt.timedelta(seconds=seconds)
    heard_from = broker.last_seen
    since = heard_from
    note = ""
    if heard.disturbed is not None and (heard_from is None or heard_from < heard.disturbed):
        # the link was cut by the console's side: the allowance starts once the broker
        # had its chance to link again
        since = heard.disturbed + dt.timedelta(seconds=settings.BROKER_RECONNECT_GRACE)
        note = (
            f"; not linked again {settings.BROKER_RECONNECT_GRACE} s after the console's "
            f"link restarted at {heard.disturbed:%H:%M:%S}"
        )
    assert heard.latest_beat is not None
    if since is not None and heard.latest_beat < since + allowed:
        return None  # no console was hearing when it became overdue (yet)
    if heard_from is None:
        return "never heard" + note
    return (
        f"no status since {heard_from:%H:%M:%S} UTC "
        f"({(now - heard_from).total_seconds():.1f} s){note}"
    )


#: never call a broker down after less than this, whatever its heartbeat interval
STALE_FLOOR = 1.0
#: a worker of a ``brokerd --workers`` host whose link closed is restarted by its host
#: (within 2 s, then its start): it is down only when silent this long
WORKER_RESTART_GRACE = 15.0
#: a refused-link alarm clears once no broker was refused for this long
LINK_REFUSED_CLEAR_SECONDS = 300
#: a name-conflict alarm clears once the second broker has been silent this long
NAME_CONFLICT_CLEAR_SECONDS = 30


def prune_samples(now: dt.datetime | None = None) -> dict[str, int]:
    """Delete heartbeat and queue samples older than ``HEARTBEAT_RETENTION`` hours."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(hours=settings.HEARTBEAT_RETENTION)
    heartbeats, _ = HeartbeatSample.objects.filter(time__lt=cutoff).delete()
    queues, _ = QueueSample.objects.filter(time__lt=cutoff).delete()
    return {"heartbeats": heartbeats, "queue_samples": queues}
