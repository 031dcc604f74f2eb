"""Heartbeat histories of the quickstart's cluster, written as brokerd and the archive would.

Three primaries and a secondary on 127.0.0.1:5701-5704, one status a second each (at
its own phase within the second).  What matters for links is how brokerd lists peers
(``Operations.status``): one entry per spid, sorted by spid, and a peer is never taken
out of the list.  A killed peer's entry turns inactive at once (its port refuses: "gone")
and stays listed; once it is back under a new spid at the same address, every status
lists the address twice, the old spid inactive and the new one active.  A restarted
broker links to its peers before their statuses reach it, so its first status lists
them inactive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import lake

START = 1_767_607_200.0  # 2026-01-05T10:00:00Z
INTERVAL = 1.0
NAMES = ["127.0.0.1:5701", "127.0.0.1:5702", "127.0.0.1:5703", "127.0.0.1:5704"]
TYPES = ["primary", "primary", "primary", "secondary"]
PHASES = [0.10, 0.35, 0.60, 0.85]
QUEUE = "orders.000"


def spid(started: float, pid: int) -> str:
    """brokerd's spid: start time in ms (hex), pid, a random part."""
    return f"{int(started * 1000):012x}-{pid}-{pid % 65536:04x}"


@dataclass
class History:
    """What happens, in seconds after ``START``.

    ``kill``: broker index, when it was killed, seconds until it is back (new spid, same
    address).  ``unseen``: (observer, peer, from, to): the observer's link to that peer
    is down in [from, to) while both keep running.
    """

    seconds: int = 600
    kill: tuple[int, float, float] | None = None
    unseen: list[tuple[int, int, float, float]] = field(default_factory=list)

    def alive(self, broker: int, t: float) -> bool:
        if self.kill is None or self.kill[0] != broker:
            return True
        _, at, down = self.kill
        return not at <= t - START < at + down

    def restarted(self, broker: int, t: float) -> bool:
        return self.kill is not None and self.kill[0] == broker and t - START >= sum(self.kill[1:])

    def spid_of(self, broker: int, t: float) -> str:
        if self.restarted(broker, t):
            assert self.kill is not None
            return spid(START + self.kill[1] + self.kill[2], 40000 + broker)
        return spid(START - 86_400 + broker, 1000 + broker)


def peer_entries(h: History, observer: int, t: float) -> list[dict[str, Any]]:
    """The ``view.peers`` of one status, as brokerd lists them."""
    entries = []
    for peer, address in enumerate(NAMES):
        if peer == observer:
            continue
        rel = t - START
        cut = any(o == observer and p == peer and a <= rel < b for o, p, a, b in h.unseen)
        old = h.spid_of(peer, START)
        if h.kill is not None and h.kill[0] == peer:
            _, at, down = h.kill
            entries.append({"spid": old, "address": address, "active": rel < at and not cut})
            if rel >= at + down:
                entries.append({"spid": h.spid_of(peer, t), "address": address, "active": not cut})
        else:
            # a restarted observer's first status: linked, no status of its peers yet
            fresh = (
                h.kill is not None
                and h.kill[0] == observer
                and 0 <= rel - (h.kill[1] + h.kill[2]) < INTERVAL
            )
            entries.append({"spid": old, "address": address, "active": not (cut or fresh)})
    return sorted(entries, key=lambda e: e["spid"])


def write_history(root: Path, h: History) -> dict[str, list[dict[str, Any]]]:
    """Write the history into a lake at ``root``; returns the rows per table."""
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in lake.SCHEMAS}
    root_spid = h.spid_of(0, START)
    for broker, name in enumerate(NAMES):
        count = 0
        for tick in range(h.seconds):
            t = START + tick * INTERVAL + PHASES[broker]
            if not h.alive(broker, t):
                continue
            if h.restarted(broker, t) and count > 0 and not h.restarted(broker, t - INTERVAL):
                count = 0  # counters restart with the process
            count += 10
            peers = peer_entries(h, broker, t)
            rows["broker_samples"].append(
                {
                    "ts": t,
                    "broker": name,
                    "spid": h.spid_of(broker, t),
                    "broker_type": TYPES[broker],
                    "is_root": broker == 0,
                    "root": root_spid,
                    "ready": True,
                    "peers_active": sum(p["active"] for p in peers),
                    "peers_known": len(peers),
                    "connections": 2,
                    "consumers": 1,
                    "queues": 1,
                    "messages_ready": 0,
                    "messages_unacked": 0,
                    "published_total": count,
                    "routed_total": count,
                    "delivered_total": count,
                }
            )
            rows["queue_samples"].append(
                {
                    "ts": t,
                    "broker": name,
                    "vhost": "/",
                    "queue": QUEUE,
                    "messages": 0,
                    "unacked": 0,
                    "consumers": 1,
                    "enqueued_total": count,
                    "delivered_total": count,
                }
            )
            rows["peer_samples"].extend(
                {
                    "ts": t,
                    "broker": name,
                    "peer": p["spid"],
                    "peer_address": p["address"],
                    "active": p["active"],
                    "rtt_ms": 0.4 if p["active"] else None,
                }
                for p in peers
            )
    for table, table_rows in rows.items():
        lake.write_rows(root, table, table_rows, "walkthrough")
    return rows
