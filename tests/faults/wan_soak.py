"""Two three-server clusters bridged across a WAN, with faults (issue 42).

``python -m tests.faults.wan_soak --seconds 120 --rtt 0.05 --bandwidth 8000000``

Each cluster runs on a network test bed of its own (``tests/support/netbed.py``:
every server in its own namespace). Between them is the WAN: one ``SlowLink``
proxy per server of cluster B, in the test's namespace on cluster A's gateway,
delaying each direction by half the round trip and capping the bandwidth. A
bridge, defined in cluster A's configuration document (pushed as the console
does), shovels the queue ``wan-out`` of A (``amqp://``) to ``wan-in`` on B,
``on-confirm``, its destination URIs the proxies (tried in turn).

Confirmed publishers write to A's servers (moving to another on a lost
connection); a consumer on B reads ``wan-in``. The faults: the WAN stalls
(``--cut`` seconds, nothing moves: a cut that no side notices at once), and the
A server running the bridge is killed (kill -9) and started again. Then the
publishers stop, the backlog drains, and the checker counts, per message:

- lost: confirmed by A and never read on B;
- unflagged duplicates: read twice, the later copy with neither the AMQP
  redelivered flag nor the bridge's ``x-redelivered`` header;
- order violations: per publisher connection, a first unflagged copy read after
  a later message of that connection.

Goal: 0 lost, 0 unflagged duplicates, 0 order violations. The report also gives
the drain rate after the stall: with ``on-confirm`` a window of
``src-prefetch-count`` messages per round trip at most.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pika

from tests.cluster_harness import Cluster
from tests.support import netbed
from tests.support.console_fake import TOKEN, FakeConsole
from tests.support.netbed import NetBed
from tests.support.slowlink import SlowLink

OUT, IN = "wan-out", "wan-in"


class Publisher(threading.Thread):
    """Confirmed publishes of ``NAME:CONN:SEQ`` at ``rate`` a second to A's servers,
    moving to the next one when a connection fails."""

    def __init__(self, name: str, hosts: list[tuple[str, int]], rate: float) -> None:
        super().__init__(daemon=True)
        self.name_ = name
        self.hosts = hosts
        self.rate = rate
        self.stop = threading.Event()
        self.confirmed: list[str] = []
        self.sent = 0
        self.failures = 0

    def run(self) -> None:
        connection_no = 0
        index = hash(self.name_) % len(self.hosts)
        seq = 0
        while not self.stop.is_set():
            host, port = self.hosts[index % len(self.hosts)]
            index += 1
            try:
                params = pika.ConnectionParameters(host, port, heartbeat=5, socket_timeout=3)
                conn = pika.BlockingConnection(params)
                ch = conn.channel()
                ch.confirm_delivery()
                connection_no += 1
                props = pika.BasicProperties(delivery_mode=2)
                while not self.stop.is_set():
                    body = f"{self.name_}:{connection_no}:{seq}"
                    seq += 1
                    self.sent += 1
                    ch.basic_publish("", OUT, body.encode(), props)
                    self.confirmed.append(body)
                    time.sleep(1 / self.rate)
                with contextlib.suppress(Exception):
                    conn.close()
            except Exception:  # the server died or was cut: on to the next one
                self.failures += 1
                time.sleep(0.2)


class Consumer(threading.Thread):
    """Reads ``wan-in`` on B: (body, flagged, when) in the order read."""

    def __init__(self, hosts: list[tuple[str, int]]) -> None:
        super().__init__(daemon=True)
        #: B's servers, tried in turn (a refused or lost connection moves on)
        self.hosts = hosts
        self.stop = threading.Event()
        self.read: list[tuple[str, bool, float]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            host, port = self.hosts[turn % len(self.hosts)]
            turn += 1
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
                ch = conn.channel()
                ch.basic_qos(prefetch_count=500)
                for method, props, body in ch.consume(IN, inactivity_timeout=0.2):
                    if self.stop.is_set():
                        break
                    if method is None:
                        continue
                    flagged = bool(method.redelivered) or bool(
                        (props.headers or {}).get("x-redelivered")
                    )
                    self.read.append((body.decode(), flagged, time.monotonic()))
                    ch.basic_ack(method.delivery_tag)
                with contextlib.suppress(Exception):
                    conn.close()
            except Exception as exc:
                self.errors.append(f"{host}:{port}: {exc!r}"[:200])
                time.sleep(0.2)


def _answers(host: str, port: int) -> bool:
    """Does a TCP connection to ``host:port`` open from here?"""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def check(confirmed: set[str], read: list[tuple[str, bool, float]]) -> dict[str, Any]:
    seen: dict[str, int] = defaultdict(int)
    unflagged_dups = 0
    order = 0
    top: dict[tuple[str, str], int] = {}
    for body, flagged, _at in read:
        seen[body] += 1
        if seen[body] > 1:
            unflagged_dups += not flagged
            continue
        if flagged:
            continue
        name, conn, seq = body.split(":")
        key = (name, conn)
        if int(seq) < top.get(key, -1):
            order += 1
        else:
            top[key] = int(seq)
    lost = sorted(confirmed - set(seen))
    return {
        "confirmed": len(confirmed),
        "read": len(read),
        "lost": len(lost),
        "lost_examples": lost[:10],
        "unflagged_duplicates": unflagged_dups,
        "flagged_copies": sum(1 for _b, f, _a in read if f),
        "order_violations": order,
    }


def running_on(cluster: Cluster) -> list[int]:
    out = []
    for index in cluster.running():
        with contextlib.suppress(Exception):
            rows = cluster.ctl(index, "bridges", "status")["bridges"]
            if any(r["state"] == "running" for r in rows):
                out.append(index)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="rookery-wan-"))
    with NetBed(3) as bed_a, NetBed(3) as bed_b:
        console = FakeConsole(host=bed_a.gateway).start()
        a = Cluster(base / "a", primaries=3, netbed=bed_a, fault_injection=False)
        b = Cluster(base / "b", primaries=3, netbed=bed_b, fault_injection=False)
        proxies: list[SlowLink] = []
        try:
            link = ["--console", console.url, f"--console-token={TOKEN}"]
            for index in range(3):
                a.start(index, extra=link)
            b.start_all()
            a.wait_until(a.settled_root, timeout=30, what="A's root")
            b.wait_until(b.settled_root, timeout=30, what="B's root")
            console.wait_for(lambda: len(console.connections) == 3, what="A's console links")
            # by node, not by bed slot: start_all renumbers nodes by seniority, and a
            # node keeps its slot's address (bed_b.address(i) may be another node's)
            a_hosts, b_hosts = a.endpoints, b.endpoints
            for index in range(3):
                proxy = SlowLink((bed_a.gateway, 0), b_hosts[index])
                proxies.append(proxy.start())
                proxy.set(delay=args.rtt / 2, rate=args.bandwidth)
            with pika.BlockingConnection(pika.ConnectionParameters(*a_hosts[0])) as conn:
                conn.channel().queue_declare(OUT, durable=True)
            with pika.BlockingConnection(pika.ConnectionParameters(*b_hosts[0])) as conn:
                conn.channel().queue_declare(IN, durable=True)
            uris = [f"amqp://guest:guest@{p.address[0]}:{p.address[1]}" for p in proxies]
            bridge = {
                "name": "wan",
                "vhost": "/",
                "value": {
                    "src-uri": "amqp://",
                    "src-queue": OUT,
                    "src-prefetch-count": args.prefetch,
                    "dest-uri": uris,
                    "dest-queue": IN,
                    "reconnect-delay": 1,
                },
            }
            console.apply_config(1, {"bridges": [bridge]}, 3)
            a.wait_until(lambda: running_on(a), timeout=30, what="the bridge running")
            unreachable = [h for h in b_hosts if not _answers(*h)]
            if unreachable:
                raise RuntimeError(f"B's servers do not answer from here: {unreachable}")
            consumer = Consumer(b_hosts)
            consumer.start()
            publishers = [Publisher(f"p{i}", a_hosts, args.rate) for i in range(args.publishers)]
            for p in publishers:
                p.start()
            events: list[str] = []
            start = time.monotonic()

            def at(offset: float) -> None:
                time.sleep(max(0.0, start + offset - time.monotonic()))

            span = args.seconds / args.rounds
            released = start
            backlogs: list[int] = []
            for round_ in range(args.rounds):
                begin = round_ * span
                at(begin + span * 0.15)
                for proxy in proxies:
                    proxy.stall()
                events.append(f"{time.monotonic() - start:.1f}s: WAN stalled for {args.cut}s")
                at(begin + span * 0.15 + args.cut)
                for proxy in proxies:
                    proxy.release()
                released = time.monotonic()
                backlog = sum(len(p.confirmed) for p in publishers) - len(consumer.read)
                backlogs.append(backlog)
                events.append(f"{released - start:.1f}s: released, backlog {backlog}")
                at(begin + span * 0.15 + args.cut + (span * 0.85 - args.cut) / 2)
                on = running_on(a)
                if on:
                    victim = on[0]
                    a.kill(victim)
                    events.append(f"{time.monotonic() - start:.1f}s: kill -9 of A[{victim}]")
                    time.sleep(5)
                    a.start(victim, extra=link)
                    events.append(f"{time.monotonic() - start:.1f}s: A[{victim}] started again")
            at(args.seconds)
            for p in publishers:
                p.stop.set()
            for p in publishers:
                p.join(10)
            confirmed = {body for p in publishers for body in p.confirmed}
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline:
                if confirmed <= {body for body, _f, _a in consumer.read}:
                    break
                time.sleep(0.5)
            consumer.stop.set()
            consumer.join(10)
            report = check(confirmed, consumer.read)
            after = [at_ for _b, _f, at_ in consumer.read if at_ >= released]
            drain = len(after) / (max(after) - released) if len(after) > 1 else 0.0
            report.update(
                events=events,
                backlogs=backlogs,
                rtt=args.rtt,
                bandwidth=args.bandwidth,
                prefetch=args.prefetch,
                window_bound=args.prefetch / args.rtt,
                drain_rate=round(drain, 1),
                publisher_failures=sum(p.failures for p in publishers),
                consumer_errors=consumer.errors[-5:],
                ok=report["lost"] == 0
                and report["unflagged_duplicates"] == 0
                and report["order_violations"] == 0,
            )
            return report
        finally:
            for proxy in proxies:
                proxy.close()
            a.close()
            b.close()
            console.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=100.0, help="publishes/s per publisher")
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--rtt", type=float, default=0.05)
    parser.add_argument("--bandwidth", type=float, default=8_000_000, help="bytes/s")
    parser.add_argument("--cut", type=float, default=30.0, help="seconds the WAN stalls")
    parser.add_argument(
        "--rounds", type=int, default=1, help="stalls and kills, evenly over --seconds"
    )
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--drain", type=float, default=120.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds / args.rounds < args.cut + 20:
        parser.error("each round needs --cut seconds and 20 more")
    why = netbed.unavailable()
    if why:
        print(f"wan_soak: no network test bed here: {why}", file=sys.stderr)
        return 2
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
