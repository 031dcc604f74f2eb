"""Objects as the dashboard's tables show them: brokers grouped by host (a ``brokerd
--workers`` host's workers together, under its summary row) and queues with where
their consumers are and which servers hold their copies."""

from __future__ import annotations

from collections.abc import Iterable

from clusterapi import objects
from clusterapi.models import Broker, QueueSnapshot
from console.dashboard.readable import iso


def grouped_by_host(brokers: list[Broker]) -> list[Broker]:
    """The brokers with each ``brokerd --workers`` host's workers together, in worker
    order, where the host's name sorts. The first worker of a host carries the host's
    summary (``host_summary``: its address, workers seen up of those it has, and their
    connections and messages), which the broker table shows as the host's row."""

    def key(b: Broker) -> tuple[str, int, str]:
        return (b.host or b.name, -1 if not b.host else (b.worker or 0), b.name)

    out = sorted(brokers, key=key)
    for b in out:
        b.host_summary = None
    hosts: dict[str, list[Broker]] = {}
    for b in out:
        if b.host:
            hosts.setdefault(b.host, []).append(b)
    for address, workers in hosts.items():
        up = [w for w in workers if w.state == Broker.STATE_UP]
        workers[0].host_summary = {
            "address": address,
            "up": len(up),
            "workers": max([w.host_workers or 0 for w in workers] + [len(workers)]),
            "connections": sum(int((w.counts or {}).get("connections") or 0) for w in up),
            "messages_ready": sum(int((w.counts or {}).get("messages_ready") or 0) for w in up),
            "alarms": sum(len((w.view or {}).get("alarms") or []) for w in up),
        }
    return out


def with_spread(queues: Iterable[QueueSnapshot]) -> list[QueueSnapshot]:
    """The queues, each with ``spread``: where its consumers are connected, by broker;
    and ``replica_set`` with ``replicas_in_sync``: the servers holding a copy of a
    shared queue as its master reports them (one query of names for the page), and
    ``fresh``: when its broker last reported."""
    names = objects.spid_names()
    out = list(queues)
    for queue in out:
        # its counts are as fresh as its broker's last status (dashboard.js dims them
        # when that is older than a few heartbeats)
        seen = queue.broker.last_seen
        queue.fresh = iso(seen) if seen is not None else ""
        queue.spread = objects.consumer_spread(queue, names)
        queue.replica_set = objects.replica_set(queue, names)
        queue.replicas_in_sync = sum(1 for r in queue.replica_set if r["in_sync"])
    return out
