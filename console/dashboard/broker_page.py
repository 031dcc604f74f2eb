"""The broker page's context: one broker's status, its peer links, its load, its
objects, the commands it ran and the actions it offers, and the configuration it
reports in force against the current version."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Q
from django.http import QueryDict
from django.utils import timezone

from clusterapi import commands, configs, decommission, events, inforce
from clusterapi.models import Broker, Command
from console.dashboard.readable import with_stamps
from console.dashboard.rows import with_spread

#: per broker page: at most this many queues, exchanges and bindings listed
BROKER_OBJECTS_SHOWN = 200


def peer_links(broker: Broker) -> list[dict[str, Any]]:
    """The broker's peer links from its last status, named as the console knows them.

    One row per server: should a status still list a restarted peer's old spid beside
    its new one at the same address, the newest run wins (the spid the console knows
    from that server's own hello, else the active link, else the later entry).
    """
    names = dict(Broker.objects.exclude(spid="").values_list("spid", "name"))
    lanes = broker.view.get("lanes")
    lanes = lanes if isinstance(lanes, dict) else {}
    out = []
    for peer in broker.view.get("peers") or []:
        if not isinstance(peer, dict):
            continue
        spid = str(peer.get("spid") or "")
        rtt = peer.get("rtt_ms")
        age = peer.get("last_seen_age")
        lane = lanes.get(spid)
        lane = lane if isinstance(lane, dict) else {}
        out.append(
            {
                "spid": spid,
                "name": names.get(spid, ""),
                "type": str(peer.get("type") or ""),
                "address": str(peer.get("address") or ""),
                "active": bool(peer.get("active")),
                "link": str(peer.get("link") or ""),
                "rtt_ms": rtt if isinstance(rtt, int | float) else None,
                "last_seen_age": age if isinstance(age, int | float) else None,
                "backlog": _number(lane.get("backlog")),
                "unsettled": _number(lane.get("unsettled")),
                "replica_lag": _number(lane.get("replica_lag")),
            }
        )
    return _one_per_address(out)


def _one_per_address(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    chosen: dict[str, int] = {}
    for i, peer in enumerate(peers):
        address = peer["address"] or peer["spid"]
        if address not in chosen:
            chosen[address] = i
            continue
        kept = peers[chosen[address]]
        rank_new = (bool(peer["name"]), peer["active"])
        if rank_new >= (bool(kept["name"]), kept["active"]):
            chosen[address] = i
    keep = sorted(chosen.values())
    return [peers[i] for i in keep]


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def load_view(broker: Broker) -> dict[str, Any]:
    """The broker under load, from its last status: flow control's causes (which
    publishers are paused and why), the status-echo round trips and the loop's lag."""
    view = broker.view
    flow = view.get("flow") if isinstance(view.get("flow"), dict) else {}
    causes = flow.get("causes") if isinstance(flow.get("causes"), dict) else {}
    echo = view.get("echo_rtt") if isinstance(view.get("echo_rtt"), dict) else {}
    loop = view.get("loop") if isinstance(view.get("loop"), dict) else {}
    lag = loop.get("lag") if isinstance(loop.get("lag"), dict) else {}
    return {
        "known": bool(flow or echo or lag),
        "causes": [
            {
                "cause": str(cause),
                "reason": str(held.get("reason") or ""),
                "paused": _number(held.get("paused")),
            }
            for cause, held in sorted(causes.items())
            if isinstance(held, dict)
        ],
        "echo_p99_ms": _number(echo.get("p99_ms")),
        "echo_max_ms": _number(echo.get("max_ms")),
        "lag_p99_ms": _number(lag.get("p99_ms")),
    }


#: a finished command stays in the broker page's banner this long
BANNER_SECONDS = 120


def banner_commands(broker: Broker) -> list[Command]:
    """The broker page's banner: its commands still on their way, and those that ended
    in the last two minutes, so the banner follows a command to its outcome live."""
    since = timezone.now() - dt.timedelta(seconds=BANNER_SECONDS)
    recent = broker.commands.filter(
        Q(state__in=Command.OPEN_STATES) | Q(finished_at__gte=since)
    ).select_related("created_by")[:3]
    return with_stamps(recent, "created_at", "finished_at")


def broker_actions(broker: Broker) -> dict[str, dict[str, str]]:
    """The actions the broker page offers: each with the command, or the reason it is
    not offered (``commands.refusal``: the API would answer 409 with the same words)."""
    root = Command.ROOT_DISABLE if broker.root_enabled else Command.ROOT_ENABLE
    return {
        "root": {"command": root, "refusal": commands.refusal(broker, root)},
        "dump": {
            "command": Command.STATE_DUMP,
            "refusal": commands.refusal(broker, Command.STATE_DUMP),
        },
    }


def _in_force(broker: Broker) -> dict[str, Any]:
    """The current version against what the broker reports in force, key by key."""
    version = configs.current()
    return {
        "in_force_version": version,
        "in_force_label": f"Version {version.number}" if version is not None else "",
        "in_force": inforce.view(version.document if version else None, broker.in_force),
    }


def build_broker(params: QueryDict) -> dict[str, Any]:
    broker = Broker.objects.filter(name=params.get("broker", "")).first()
    if broker is None:
        return {"broker": None}
    [broker] = with_stamps([broker], "last_seen", "start_time", "retired_at")
    dump = (
        broker.commands.filter(name=Command.STATE_DUMP, state=Command.STATE_ACKED)
        .order_by("-finished_at")
        .first()
    )
    queues = broker.queues.select_related("broker")
    return {
        "broker": broker,
        "peers": peer_links(broker),
        "load": load_view(broker),
        "queues": with_spread(queues[:BROKER_OBJECTS_SHOWN]),
        "queue_count": queues.count(),
        "proxy_count": queues.filter(master=False).count(),
        "exchanges": list(broker.exchanges.all()[:BROKER_OBJECTS_SHOWN]),
        "exchange_count": broker.exchanges.count(),
        "bindings": list(broker.bindings.all()[:BROKER_OBJECTS_SHOWN]),
        "binding_count": broker.bindings.count(),
        "commands": with_stamps(broker.commands.all()[:10], "created_at", "finished_at"),
        "banner": banner_commands(broker),
        "actions": broker_actions(broker),
        "decommission_refusal": decommission.refusal(broker),
        "events": with_stamps(broker.events.all()[: events.SHOWN], "time"),
        **_in_force(broker),
        "dump": with_stamps([dump], "finished_at")[0] if dump else None,
        "dump_text": (dump.result or {}).get("dump", "") if dump else "",
        "alarms": with_stamps(broker.alarms.filter(active=True), "raised_at", "acknowledged_at"),
        "live_broker": broker.name,
    }
