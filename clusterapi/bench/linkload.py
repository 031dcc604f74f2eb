"""Load the console's broker link as N brokers would, and measure what it costs.

    python -m clusterapi.bench.linkload --console ws://127.0.0.1:8000/ws/brokers/ \\
        --token TOKEN --brokers 10 --queues 1000 --rate 1 --duration 60

Each fake broker speaks the link protocol of docs/protocol.md ("Console link"):
``hello``, then a ``status`` every ``1/rate`` seconds with a full snapshot of its
queues, exchanges and bindings first and every 30th status (or on ``resync``),
deltas in between carrying the queues that changed (``--churn`` of them per
second, plus a queue deleted and one created now and then); it answers every
``command`` with an ``ack``. Statuses are paced on a fixed schedule, not
back-to-back, so a slow console shows up as delay rather than as fewer messages.

Measured over ``--duration`` after ``--warmup``:

- CPU of the console's processes (psutil): Daphne (found by the port of
  ``--console`` unless ``--daphne-pid``), and the Celery worker with its
  children when ``--worker-pid`` is given;
- ingest delay: from a status's ``time`` (when the fake broker sent it) to the
  moment its ``HeartbeatSample`` is visible in the console's database (it is
  written in the same transaction as the queue updates), found by polling the
  database every ``--poll`` seconds; so each delay is late by up to one poll
  interval. The bench reads the database through the console's Django settings,
  so run it with the console's environment (``DATA_DIR`` / ``DATABASE_URL``).

For ``clusterapi.bench.pageload --live`` (how late the dashboard shows a status):
``--tag-connections`` makes each status report its seq as the broker's connection
count, which the overview's broker table shows, and ``--sent-log`` writes every
status sent (broker, seq, time) to a CSV file as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

import websockets

from clusterapi.bench.meters import CpuMeter, DelayPoller, listening_pid, summary

FULL_EVERY = 30  # statuses; the broker's own rhythm (docs/protocol.md)
VHOST = "/"


# -- one fake broker ---------------------------------------------------------------------


@dataclass
class QueueState:
    name: str
    messages: int = 0
    unacked: int = 0
    consumers: int = 1
    enqueued: int = 0
    delivered: int = 0

    def entry(self) -> dict[str, Any]:
        return {
            "vhost": VHOST,
            "name": self.name,
            "durable": True,
            "exclusive": False,
            "auto_delete": False,
            "shared": False,
            "messages": self.messages,
            "unacked": self.unacked,
            "consumers": self.consumers,
            "enqueued": self.enqueued,
            "delivered": self.delivered,
            "arguments": {},
        }


@dataclass
class FakeBroker:
    """The link side of one brokerd: its queues, their churn, and what it sends."""

    index: int
    queues: int
    churn: float
    rate: float
    rng: random.Random
    #: report each status's seq as the connection count, so that a page showing the
    #: broker's connections shows which status it is on (``pageload --live``)
    tag: bool = False
    spid: str = field(default_factory=lambda: uuid.uuid4().hex[:20])
    seq: int = 0
    want_full: bool = True
    created: int = 0
    state: dict[str, QueueState] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)
    totals: dict[str, int] = field(
        default_factory=lambda: {"published": 0, "routed": 0, "delivered": 0, "acked": 0}
    )
    #: status time (rounded to the microsecond, as stored) -> whether it was a full snapshot
    sent: dict[float, bool] = field(default_factory=dict)
    acks: int = 0
    #: queues whose binding the console has been sent
    _bound: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for _ in range(self.queues):
            self._create()

    @property
    def name(self) -> str:
        return f"127.0.1.{self.index + 1}:5672"

    def _create(self) -> None:
        queue = QueueState(f"bench.q{self.created:06d}")
        self.created += 1
        self.state[queue.name] = queue
        self.changed.add(queue.name)

    def hello(self) -> dict[str, Any]:
        return {
            "v": 1,
            "type": "hello",
            "spid": self.spid,
            "name": self.name,
            "address": self.name,
            "broker_type": "primary",
            "version": "linkload",
            "start_time": time.time(),
            "cluster": "linkload",
            "checksum": None,
            "heartbeat_interval": 1.0 / self.rate,
            "config_version": None,
            "config_checksum": None,
        }

    def tick(self, elapsed: float) -> None:
        """One interval of traffic: ``churn`` of the queues move, one queue may be replaced."""
        moving = max(1, int(len(self.state) * self.churn * elapsed))
        for name in self.rng.sample(sorted(self.state), min(moving, len(self.state))):
            q = self.state[name]
            published = self.rng.randint(1, 50)
            delivered = self.rng.randint(0, published + q.messages)
            q.enqueued += published
            q.delivered += delivered
            q.messages = max(0, q.messages + published - delivered)
            q.unacked = self.rng.randint(0, 5)
            self.totals["published"] += published
            self.totals["routed"] += published
            self.totals["delivered"] += delivered
            self.totals["acked"] += delivered
            self.changed.add(name)
        if self.rng.random() < 0.2 * elapsed:  # a short-lived queue goes and another comes
            gone = self.rng.choice(sorted(self.state))
            del self.state[gone]
            self.changed.discard(gone)
            self.removed.append(gone)
            self._create()

    def status(self, peers: list[dict[str, Any]], root_spid: str) -> dict[str, Any]:
        # Periodic snapshots at a per-broker phase, as brokers that connected at different
        # times send them (the first status is always full).
        full = self.want_full or (self.seq + self.index * 7) % FULL_EVERY == 0
        self.want_full = False
        if full:
            queues: Any = [q.entry() for q in self.state.values()]
            exchanges: Any = [
                {
                    "vhost": VHOST,
                    "name": "bench.direct",
                    "type": "direct",
                    "durable": True,
                    "auto_delete": False,
                    "internal": False,
                    "arguments": {},
                }
            ]
            bindings: Any = [
                {
                    "vhost": VHOST,
                    "source": "bench.direct",
                    "destination": name,
                    "destination_type": "queue",
                    "routing_key": name,
                    "arguments": {},
                }
                for name in self.state
            ]
        else:
            queues = {
                "upsert": [self.state[n].entry() for n in sorted(self.changed)],
                "remove": [[VHOST, n] for n in self.removed],
            }
            new = [n for n in self.changed if n not in self._bound]
            exchanges = {"upsert": [], "remove": []}
            bindings = {
                "upsert": [
                    {
                        "vhost": VHOST,
                        "source": "bench.direct",
                        "destination": n,
                        "destination_type": "queue",
                        "routing_key": n,
                        "arguments": {},
                    }
                    for n in new
                ],
                "remove": [[VHOST, "bench.direct", n, "queue", n] for n in self.removed],
            }
        self._bound = set(self.state)
        self.changed.clear()
        self.removed.clear()
        messages_ready = sum(q.messages for q in self.state.values())
        now = time.time()
        msg = {
            "v": 1,
            "type": "status",
            "seq": self.seq,
            "time": now,
            "full": full,
            "view": {
                "is_root": self.spid == root_spid,
                "root": root_spid,
                "ready": True,
                "root_enabled": True,
                "quorum": True,
                "vote": root_spid,
                "reason": "",
                "checksum": "0123456789abcdef",
                "alarms": [],
                "peers": peers,
            },
            "counts": {
                "connections": self.seq if self.tag else 4,
                "channels": 8,
                "consumers": len(self.state),
                "vhosts": 1,
                "exchanges": 8,
                "queues": len(self.state),
                "bindings": len(self.state),
                "messages_ready": messages_ready,
                "messages_unacked": sum(q.unacked for q in self.state.values()),
            },
            "totals": dict(self.totals, returned=0),
            "rates": {"published": 0.0, "routed": 0.0, "delivered": 0.0},
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }
        self.seq += 1
        self.sent[round(now, 6)] = full
        return msg

    def answer(self, command: dict[str, Any]) -> dict[str, Any]:
        """The ack a brokerd gives (it applies nothing here)."""
        name, args = command.get("command"), command.get("args") or {}
        result: dict[str, Any] | None
        if name == "config.apply":
            result = {"config_version": args.get("version"), "config_checksum": "", "applied": []}
        elif name in ("root.enable", "root.disable"):
            result = {"root_enabled": name == "root.enable"}
        elif name == "state.dump":
            result = {"dump": f"linkload broker {self.name}: {len(self.state)} queues"}
        else:
            return {
                "v": 1,
                "type": "ack",
                "id": command.get("id"),
                "ok": False,
                "result": None,
                "error": f"unknown command {name!r}",
            }
        self.acks += 1
        return {
            "v": 1,
            "type": "ack",
            "id": command.get("id"),
            "ok": True,
            "result": result,
            "error": None,
        }


async def run_broker(
    broker: FakeBroker,
    url: str,
    token: str,
    peers: list[dict[str, Any]],
    root_spid: str,
    stop_at: float,
    stats: dict[str, int],
    sent_log: TextIO | None = None,
) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with websockets.connect(url, additional_headers=headers, max_size=64 << 20) as ws:
        await ws.send(json.dumps(broker.hello()))

        async def reader() -> None:
            async for raw in ws:
                msg = json.loads(raw)
                if msg.get("type") == "resync":
                    broker.want_full = True
                    stats["resyncs"] += 1
                elif msg.get("type") == "command":
                    await ws.send(json.dumps(broker.answer(msg)))

        read_task = asyncio.create_task(reader())
        interval = 1.0 / broker.rate
        # Spread the brokers over the interval, as independent brokers would be.
        next_at = time.monotonic() + interval * broker.index / max(1, stats["brokers"])
        last = time.monotonic()
        try:
            while time.monotonic() < stop_at:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                now = time.monotonic()
                broker.tick(now - last)
                last = now
                others = [p for p in peers if p["spid"] != broker.spid]
                status = broker.status(others, root_spid)
                text = json.dumps(status)
                stats["bytes"] += len(text)
                stats["statuses"] += 1
                await ws.send(text)
                if sent_log is not None:
                    sent_log.write(
                        f"{broker.name},{status['seq']},{status['time']:.6f},{int(status['full'])}\n"
                    )
                    sent_log.flush()
                next_at += interval
                if next_at < time.monotonic():  # we fell behind: skip, never burst
                    stats["late"] += 1
                    next_at = time.monotonic() + interval
        finally:
            read_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, websockets.ConnectionClosed):
                await read_task


# -- the run -------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    brokers = [
        FakeBroker(
            i, args.queues, args.churn, args.rate, random.Random(rng.random()), args.tag_connections
        )
        for i in range(args.brokers)
    ]
    peers = [
        {
            "spid": b.spid,
            "type": "primary",
            "address": b.name,
            "active": True,
            "link": "up",
            "last_seen_age": 0.2,
            "rtt_ms": 0.4,
        }
        for b in brokers
    ]
    root_spid = brokers[0].spid

    meters: dict[str, CpuMeter] = {}
    daphne_pid = args.daphne_pid or listening_pid(urlsplit(args.console).port or 80)
    if daphne_pid:
        meters["daphne"] = CpuMeter(daphne_pid, children=False)
    else:
        print("warning: Daphne's pid not found; pass --daphne-pid", file=sys.stderr)
    if args.worker_pid:
        meters["celery"] = CpuMeter(args.worker_pid, children=True)
    if args.redis_pid:
        meters["redis"] = CpuMeter(args.redis_pid, children=False)

    poller = None
    if not args.no_db:
        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
        django.setup()
        poller = DelayPoller([b.name for b in brokers], args.poll)
        poller.start()

    stats = {"statuses": 0, "bytes": 0, "late": 0, "resyncs": 0, "brokers": len(brokers)}
    started = time.monotonic()
    stop_at = started + args.warmup + args.duration
    sent_log = open(args.sent_log, "w") if args.sent_log else None  # noqa: SIM115
    if sent_log is not None:
        sent_log.write("broker,seq,time,full\n")
    tasks = [
        asyncio.create_task(
            run_broker(b, args.console, args.token, peers, root_spid, stop_at, stats, sent_log)
        )
        for b in brokers
    ]
    await asyncio.sleep(args.warmup)
    for meter in meters.values():
        meter.start()
    if poller is not None:
        poller.measuring = True
    window = {k: stats[k] for k in ("statuses", "bytes")}
    t0 = time.monotonic()
    try:
        await asyncio.gather(*tasks)
    finally:
        if sent_log is not None:
            sent_log.close()
    # Statuses sent at the very end may still be in flight: give them a moment.
    elapsed = time.monotonic() - t0
    for meter in meters.values():
        meter.stop()
    if poller is not None:
        await asyncio.sleep(min(5.0, 10 * args.poll + 1.0))
        poller.measuring = False
        poller.stopping.set()
        poller.join(5)
        if poller.error is not None:
            raise poller.error

    sent = stats["statuses"] - window["statuses"]
    result: dict[str, Any] = {
        "brokers": args.brokers,
        "queues_per_broker": args.queues,
        "rate_hz": args.rate,
        "churn_per_second": args.churn,
        "duration_s": round(elapsed, 1),
        "statuses_sent": sent,
        "statuses_per_s": round(sent / elapsed, 2),
        "link_kib_per_s": round((stats["bytes"] - window["bytes"]) / 1024 / elapsed, 1),
        "late_statuses": stats["late"],
        "resyncs": stats["resyncs"],
        "cpu_percent": {name: round(100 * m.seconds / elapsed, 1) for name, m in meters.items()},
        "rss_mib": {name: round(m.rss_mib, 1) for name, m in meters.items()},
    }
    if poller is not None:
        kinds = {b.name: b.sent for b in brokers}
        by_kind: dict[str, list[float]] = {"all": [], "delta": [], "full": []}
        for name, sent_at, delay in poller.delays:
            full = kinds[name].get(round(sent_at, 6))
            by_kind["all"].append(1000 * delay)
            if full is not None:
                by_kind["full" if full else "delta"].append(1000 * delay)
        result["ingest_delay_ms"] = {kind: summary(delays) for kind, delays in by_kind.items()}
        result["ingest_delay_ms"]["poll_interval_ms"] = round(1000 * args.poll, 1)
        if args.trace:
            with open(args.trace, "w") as out:
                out.write("broker,status_time,delay_ms,full\n")
                for name, sent_at, delay in sorted(poller.delays, key=lambda d: d[1]):
                    full = kinds[name].get(round(sent_at, 6))
                    out.write(f"{name},{sent_at:.6f},{1000 * delay:.1f},{int(bool(full))}\n")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m clusterapi.bench.linkload",
        description="Load the console's broker link as N fake brokers; measure CPU and delay.",
    )
    parser.add_argument("--console", required=True, help="ws://host:port/ws/brokers/")
    parser.add_argument("--token", default=os.environ.get("CONSOLE_BROKER_TOKEN", ""))
    parser.add_argument("--brokers", type=int, default=10)
    parser.add_argument("--queues", type=int, default=1000, help="queues per broker")
    parser.add_argument("--rate", type=float, default=1.0, help="statuses per second per broker")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument(
        "--churn", type=float, default=0.1, help="fraction of queues changing per second"
    )
    parser.add_argument("--poll", type=float, default=0.02, help="database poll interval (s)")
    parser.add_argument("--daphne-pid", type=int, help="default: the listener of --console")
    parser.add_argument("--worker-pid", type=int, help="Celery worker (children included)")
    parser.add_argument("--redis-pid", type=int)
    parser.add_argument("--no-db", action="store_true", help="skip the delay measurement")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument("--trace", help="write every status's delay to this CSV file")
    parser.add_argument(
        "--sent-log",
        help="write every status sent (broker, seq, time, full) to this CSV file as it goes",
    )
    parser.add_argument(
        "--tag-connections",
        action="store_true",
        help="report each status's seq as the broker's connection count (pageload --live)",
    )
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token (or CONSOLE_BROKER_TOKEN) is required")
    for name in ("brokers", "queues"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not 0 < args.rate <= 50:
        parser.error("--rate must be in (0, 50]")
    if not 0 <= args.churn <= 1:
        parser.error("--churn must be in [0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
