"""What a restarted primary's catch-up of a deep queue costs confirmed publishers.

    python -m tests.faults.catch_up --depth 200000 --runs 3

Three primaries with the default heartbeat (1.0 s / 3.0 s unless told). A
deep shared queue is filled on the root; ``--publishers`` clients publish
with confirms, one at a time, to their own queues (on the root, then
alternately on the other server that stays up). Each run kill -9s the
primary that is neither the root nor the publishers' server, starts it
again, and measures every confirm's latency: before the kill, while the
server restarts (until its control socket answers), and while it syncs
(until its status says its copy is whole). Runs alternate between the deep
queue and an empty one, so the restart's own cost (a process starting on
the same cores) is measured beside the sync's. Issue 21: confirms go on at
no worse than 2x their p99 before the restart.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass, field

import pika

from tests.cluster_harness import Cluster

BODY = b"d" * 250


@dataclass
class Confirms:
    """(monotonic time, latency) of every confirm, from every publisher."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def between(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [latency for at, latency in self.samples if start <= at < end]


def publish(port: int, queue: str, confirms: Confirms) -> None:
    conn = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=60)
    )
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    sent = 0
    try:
        while not confirms.stop.is_set():
            began = time.monotonic()
            channel.basic_publish("", queue, BODY)
            with confirms.lock:
                confirms.samples.append((began, time.monotonic() - began))
            sent += 1
            if sent % 5000 == 0:  # no consumer: keep the live queue short
                channel.queue_purge(queue)
    finally:
        conn.close()


def fill(port: int, depth: int) -> None:
    """The deep queue holds exactly ``depth`` messages."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = conn.channel()
    channel.queue_declare("deep", durable=True)
    have = channel.queue_declare("deep", passive=True).method.message_count
    if have > depth:
        channel.queue_purge("deep")
        have = 0
    for _ in range(depth - have):
        channel.basic_publish("", "deep", BODY)
    deadline = time.monotonic() + 120
    while channel.queue_declare("deep", passive=True).method.message_count < depth:
        if time.monotonic() > deadline:
            raise RuntimeError("the deep queue did not fill")
        time.sleep(0.1)
    conn.close()


def figures(latencies: list[float]) -> str:
    if not latencies:
        return "no confirms"
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"n={len(ordered)} p50={statistics.median(ordered) * 1000:.1f} ms "
        f"p99={p99 * 1000:.1f} ms max={ordered[-1] * 1000:.1f} ms"
    )


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind")
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=3.0)
    opts = parser.parse_args(argv)
    with Cluster.temporary(
        "rookery-catch-up-", 3, 0, interval=opts.interval, timeout=opts.timeout
    ) as cluster:
        return run(cluster, opts)


def run(cluster: Cluster, opts: argparse.Namespace) -> int:
    ratios: dict[int, list[float]] = {opts.depth: [], 0: []}
    root = cluster.start_settled()
    root_spid = cluster.spid(root)
    target, other = cluster.followers(root)
    confirms = Confirms()
    homes = [root, other]  # never the restarted server: its clients would just fail
    threads = [
        threading.Thread(
            target=publish,
            args=(cluster.ports[homes[n % 2]], f"live-{n}", confirms),
            daemon=True,
        )
        for n in range(opts.publishers)
    ]
    for thread in threads:
        thread.start()
    for run in range(2 * opts.runs):
        depth = opts.depth if run % 2 == 0 else 0
        fill(cluster.ports[root], depth)
        if cluster.settled_root() != root_spid:
            raise RuntimeError("the root moved: the runs compare one root")
        time.sleep(1.0)
        began = time.monotonic()
        time.sleep(3.0)
        killed = cluster.kill(target)
        cluster.start(target)
        answering = time.monotonic()
        deadline = answering + 120
        while True:
            view = cluster.status(target) or {}
            if view.get("ready") and (view.get("copies") or {}).get("complete"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the restarted primary did not catch up within 120 s")
            time.sleep(0.02)
        whole = time.monotonic()
        time.sleep(0.5)
        before = confirms.between(began, killed)
        restart = confirms.between(killed, answering)
        sync = confirms.between(answering, whole)
        during = confirms.between(killed, whole)
        ratio = p99(during) / p99(before) if before and during else float("nan")
        ratios[depth].append(ratio)
        print(
            f"run {run}: depth {depth}, restart {answering - killed:.2f}s, "
            f"sync {whole - answering:.2f}s"
        )
        print(f"  before  {figures(before)}")
        print(f"  restart {figures(restart)}")
        print(f"  sync    {figures(sync)}")
        print(f"  whole   {figures(during)}  p99 ratio {ratio:.2f}x", flush=True)
    confirms.stop.set()
    for thread in threads:
        thread.join(10)
    for depth, values in ratios.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"depth {depth}: p99 during / before = {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
