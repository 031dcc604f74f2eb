"""The pause a queue move costs its clients: moves under confirmed traffic.

    python -m brokerd.bench.move                  # 12 moves, one a second
    python -m brokerd.bench.move --moves 30 --json move.json

Starts three brokerd primaries on free loopback ports, declares a durable
(replicated) queue through the first, and runs a publisher with confirms
(persistent 512-byte messages, one at a time) on the second server and an
acking consumer (prefetch 100) on the third. Every second it moves the
queue's owner to the next primary with ``brokerd ctl queue move`` through a
server in turn. For each move it reports the hand-over as ``ctl`` measured it
(request to placement), and the longest wait the publisher had for a confirm
and the consumer for a delivery from the move's start to half a second after
its end, against the same waits' 99th percentile away from any move. At the
end it checks that every confirmed message was delivered.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika

from brokerd.bench.cluster import BrokerdCluster
from brokerd.server.control import request

QUEUE = "move-bench"
BODY = b"x" * 512


class Traffic:
    """The publisher and the consumer, with the time of each confirm and delivery."""

    def __init__(self, publish_port: int, consume_port: int) -> None:
        self.publish_port = publish_port
        self.consume_port = consume_port
        self.confirms: list[float] = []
        self.deliveries: list[float] = []
        self.received: set[int] = set()
        self.stop = threading.Event()
        self.published = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._publish, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def _connect(self, port: int) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))

    def _publish(self) -> None:
        try:
            with self._connect(self.publish_port) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                n = 0
                while not self.stop.is_set():
                    n += 1
                    props = pika.BasicProperties(delivery_mode=2, message_id=str(n))
                    ch.basic_publish("", QUEUE, BODY, props)
                    self.confirms.append(time.monotonic())
        except BaseException as exc:  # reported by the run
            self.errors.append(exc)
        finally:
            self.published.set()

    def _consume(self) -> None:
        try:
            with self._connect(self.consume_port) as conn:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=100)

                def on_message(ch: Any, method: Any, props: Any, _body: bytes) -> None:
                    self.deliveries.append(time.monotonic())
                    self.received.add(int(props.message_id))
                    ch.basic_ack(method.delivery_tag)

                ch.basic_consume(QUEUE, on_message)
                quiet_since = None
                while True:
                    before = len(self.deliveries)
                    conn.process_data_events(time_limit=0.1)
                    if not self.published.is_set():
                        continue
                    if len(self.deliveries) != before:
                        quiet_since = None
                    elif quiet_since is None:
                        quiet_since = time.monotonic()
                    elif time.monotonic() - quiet_since > 2.0:
                        return
        except BaseException as exc:  # reported by the run
            self.errors.append(exc)


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest wait between consecutive events that ends within [start, end]."""
    gaps = [b - a for a, b in itertools.pairwise(times) if start <= b <= end]
    return max(gaps, default=end - start)


def quiet_p99(times: list[float], windows: list[tuple[float, float]]) -> float:
    """The 99th percentile of the waits away from every move."""
    gaps = [b - a for a, b in itertools.pairwise(times) if not any(s <= b <= e for s, e in windows)]
    if len(gaps) < 2:
        return 0.0
    return statistics.quantiles(gaps, n=100)[98]


def run(moves: int, every: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="move-bench-") as tmp:
        cluster = BrokerdCluster(Path(tmp))
        try:
            cluster.start()
            with pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", cluster.ports[0])
            ) as conn:
                conn.channel().queue_declare(QUEUE, durable=True)
            spids = [node.status()["spid"] for node in cluster.nodes]  # type: ignore[index]
            traffic = Traffic(cluster.ports[1], cluster.ports[2])
            for thread in traffic.threads:
                thread.start()
            time.sleep(every)
            owner = 0
            results = []
            for i in range(moves):
                to = (owner + 1) % len(spids)
                asked_of = cluster.nodes[i % len(cluster.nodes)]
                started = time.monotonic()
                reply = request(asked_of.data_dir, "queue", ["move", QUEUE, spids[to]], timeout=30)
                ended = time.monotonic()
                ok = bool(reply.get("ok"))
                if ok:
                    owner = to
                results.append(
                    {
                        "to": to,
                        "ok": ok,
                        "ms": reply["result"]["ms"] if ok else None,
                        "error": None if ok else reply.get("error"),
                        "window": (started, ended + 0.5),
                    }
                )
                print(f"move {i + 1}: -> [{to}] {reply.get('result') or reply}", file=sys.stderr)
                time.sleep(every)
            traffic.stop.set()
            for thread in traffic.threads:
                thread.join(30)
            windows = [r.pop("window") for r in results]
            for r, (start, end) in zip(results, windows, strict=True):
                r["confirm_gap_ms"] = round(longest_gap(traffic.confirms, start, end) * 1000, 1)
                r["delivery_gap_ms"] = round(longest_gap(traffic.deliveries, start, end) * 1000, 1)
            confirmed = len(traffic.confirms)
            lost = confirmed - len(traffic.received & set(range(1, confirmed + 1)))
            done = [r for r in results if r["ok"]]
            return {
                "moves": results,
                "errors": [repr(e) for e in traffic.errors],
                "confirmed": confirmed,
                "delivered": len(traffic.deliveries),
                "lost": lost,
                "move_ms_median": statistics.median(r["ms"] for r in done) if done else None,
                "move_ms_max": max((r["ms"] for r in done), default=None),
                "confirm_gap_ms_max": max((r["confirm_gap_ms"] for r in done), default=None),
                "delivery_gap_ms_max": max((r["delivery_gap_ms"] for r in done), default=None),
                "confirm_gap_p99_quiet_ms": round(quiet_p99(traffic.confirms, windows) * 1000, 1),
                "delivery_gap_p99_quiet_ms": round(
                    quiet_p99(traffic.deliveries, windows) * 1000, 1
                ),
            }
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brokerd.bench.move", description=__doc__)
    parser.add_argument("--moves", type=int, default=12)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between moves")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    report = run(args.moves, args.every)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    ok = report["lost"] == 0 and not report["errors"] and all(m["ok"] for m in report["moves"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
