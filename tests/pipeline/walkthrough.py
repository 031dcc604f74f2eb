"""Heartbeat histories of the quickstart's cluster, written as brokerd and the archive would.

Three primaries and a secondary on 127.0.0.1:5701-5704, one status a second each (at
its own phase within the second).  What matters for links is how brokerd lists peers
(``Operations.status``): one entry per spid, sorted by spid, and a peer is never taken
out of the list.  A killed peer's entry turns inactive at once (its port refuses: "gone")
and stays listed; once it is back under a new spid at the same address, every status
lists the address twice, the old spid inactive and the new one active.  A restarted
broker links to its peers before their statuses reach it, so its first status lists
them inactive.

Issue 45 adds what the console sees of its own absence and of planned stops: while the
console is away nothing is recorded (the brokers run on, and their links come back at
their own pace after it returns), and a broker that stops as planned has a sample marked
``stopping`` (the one the console had when the message came) and one more status after
it, as ``ingest.record_stopping`` leaves them.
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
    address; None: never back).  ``stop``: the same for a planned stop.  ``unseen``:
    (observer, peer, from, to): the observer's link to that peer is down in [from, to)
    while both keep running.  ``console_away``: (from, to) without any sample recorded;
    broker ``b`` is recorded again ``reconnect[b]`` seconds after ``to``.  ``roots``:
    (from, broker index or None) changes of the root every broker reports.
    """

    seconds: int = 600
    kill: tuple[int, float, float | None] | None = None
    unseen: list[tuple[int, int, float, float]] = field(default_factory=list)
    stop: tuple[int, float, float | None] | None = None
    console_away: list[tuple[float, float]] = field(default_factory=list)
    reconnect: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    roots: list[tuple[float, int | None]] = field(default_factory=lambda: [(0.0, 0)])

    def down_of(self, broker: int) -> tuple[float, float | None] | None:
        """When ``broker`` went down (killed or stopped), and for how long (None: for good)."""
        for event in (self.kill, self.stop):
            if event is not None and event[0] == broker:
                return event[1], event[2]
        return None

    def back_at(self, broker: int) -> float | None:
        """When ``broker`` is back under a new spid (seconds after START), if ever."""
        down = self.down_of(broker)
        if down is None or down[1] is None:
            return None
        return down[0] + down[1]

    def alive(self, broker: int, t: float) -> bool:
        down = self.down_of(broker)
        if down is None:
            return True
        at, length = down
        return not (at <= t - START and (length is None or t - START < at + length))

    def heard(self, broker: int, t: float) -> bool:
        """Whether the console records this broker's status at ``t``."""
        rel = t - START
        away = any(a <= rel < b + self.reconnect[broker] for a, b in self.console_away)
        return self.alive(broker, t) and not away

    def restarted(self, broker: int, t: float) -> bool:
        back = self.back_at(broker)
        return back is not None and t - START >= back

    def stopping(self, broker: int, t: float) -> bool:
        """The console marked this sample: the one before the last of a planned stop."""
        if self.stop is None or self.stop[0] != broker or self.restarted(broker, t):
            return False
        return self.stop[1] - 2 * INTERVAL <= t - START < self.stop[1] - INTERVAL

    def spid_of(self, broker: int, t: float) -> str:
        if self.restarted(broker, t):
            back = self.back_at(broker)
            assert back is not None
            return spid(START + back, 40000 + broker)
        return spid(START - 86_400 + broker, 1000 + broker)

    def root_of(self, t: float) -> int | None:
        """The broker every status names as root at ``t``."""
        return [who for at, who in self.roots if at <= t - START][-1]


def peer_entries(h: History, observer: int, t: float) -> list[dict[str, Any]]:
    """The ``view.peers`` of one status, as brokerd lists them."""
    entries = []
    for peer, address in enumerate(NAMES):
        if peer == observer:
            continue
        rel = t - START
        cut = any(o == observer and p == peer and a <= rel < b for o, p, a, b in h.unseen)
        old = h.spid_of(peer, START)
        down = h.down_of(peer)
        if down is not None:
            entries.append({"spid": old, "address": address, "active": rel < down[0] and not cut})
            if h.restarted(peer, t):
                entries.append({"spid": h.spid_of(peer, t), "address": address, "active": not cut})
        else:
            # a restarted observer's first status: linked, no status of its peers yet
            back = h.back_at(observer)
            fresh = back is not None and 0 <= rel - back < INTERVAL
            entries.append({"spid": old, "address": address, "active": not (cut or fresh)})
    return sorted(entries, key=lambda e: e["spid"])


def write_history(root: Path, h: History) -> dict[str, list[dict[str, Any]]]:
    """Write the history into a lake at ``root``; returns the rows per table."""
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in lake.SCHEMAS}
    for broker, name in enumerate(NAMES):
        count = 0
        for tick in range(h.seconds):
            t = START + tick * INTERVAL + PHASES[broker]
            if not h.alive(broker, t):
                continue
            if h.restarted(broker, t) and count > 0 and not h.restarted(broker, t - INTERVAL):
                count = 0  # counters restart with the process
            count += 10  # while the console is away too: the broker runs on
            if not h.heard(broker, t):
                continue
            peers = peer_entries(h, broker, t)
            leader = h.root_of(t)
            rows["broker_samples"].append(
                {
                    "ts": t,
                    "broker": name,
                    "spid": h.spid_of(broker, t),
                    "broker_type": TYPES[broker],
                    "is_root": broker == leader,
                    "root": None if leader is None else h.spid_of(leader, t),
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
                    "stopping": h.stopping(broker, t),
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
