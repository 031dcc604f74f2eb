"""What a root failure costs a queue the root does not own (issue 23: failover per queue).

    python -m tests.faults.owner_outage --runs 3 --fault pause
    python -m tests.faults.owner_outage --runs 3 --fault kill

Three primaries (heartbeat 0.5 s / 2.5 s unless told). On a primary that is
not the root, two confirmed publishers run side by side: one into a classic
queue owned by a second non-root primary, one into a durable queue without a
type (replicated, mastered on the root). Each run then SIGSTOPs the root
past the heartbeat timeout (``pause``, a failover by timeout) or kill -9s it
(``kill``), and reports each publisher's worst gap between two confirms.
The queue the root did not own should see no outage; the root's queue waits
for the failover.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time

import pika
from pika.adapters.blocking_connection import BlockingConnection

from tests.cluster_harness import Cluster


def _connect(cluster: Cluster, index: int) -> BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1", cluster.ports[index], blocked_connection_timeout=60
    )
    return BlockingConnection(params)


class Publisher(threading.Thread):
    """Confirmed publishes in a loop; the worst gap between two confirms."""

    def __init__(self, cluster: Cluster, index: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.index, self.queue = cluster, index, queue
        self.stop = threading.Event()
        self.worst = 0.0
        self.confirmed = 0
        self.failures = 0

    def run(self) -> None:
        conn = _connect(self.cluster, self.index)
        channel = conn.channel()
        channel.confirm_delivery()
        last = time.monotonic()
        while not self.stop.is_set():
            try:
                channel.basic_publish("", self.queue, b"x")
                self.confirmed += 1
            except Exception:  # nacked, or the connection went: counted, then again
                self.failures += 1
                with contextlib.suppress(Exception):  # it is going anyway
                    conn.close()
                conn = _connect(self.cluster, self.index)
                channel = conn.channel()
                channel.confirm_delivery()
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now
        conn.close()


def run_once(opts: argparse.Namespace, number: int) -> dict[str, float]:
    with Cluster.temporary(
        "rookery-owner-outage-", 3, 0, interval=opts.interval, timeout=opts.timeout
    ) as cluster:
        root = cluster.start_settled()
        owner, publisher = cluster.followers(root)
        with _connect(cluster, owner) as conn:
            channel = conn.channel()
            channel.queue_declare("on-owner", arguments={"x-queue-type": "classic"})
            channel.queue_declare("on-root", durable=True)
        threads = [Publisher(cluster, publisher, q) for q in ("on-owner", "on-root")]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        if opts.fault == "kill":
            cluster.kill(root)
            time.sleep(opts.timeout + 3.0)
        else:
            cluster.pause(root)
            time.sleep(opts.timeout + 2.0)
            cluster.resume(root)
            time.sleep(3.0)
        for thread in threads:
            thread.stop.set()
        for thread in threads:
            thread.join(30)
        result = {
            "owner_gap_s": round(threads[0].worst, 3),
            "root_gap_s": round(threads[1].worst, 3),
            "owner_failures": threads[0].failures,
            "root_failures": threads[1].failures,
        }
        print(
            f"run {number} ({opts.fault}): classic queue on another primary: worst gap "
            f"{result['owner_gap_s']:.3f} s ({threads[0].confirmed} confirmed, "
            f"{threads[0].failures} failed); replicated queue on the root: worst gap "
            f"{result['root_gap_s']:.3f} s ({threads[1].confirmed} confirmed, "
            f"{threads[1].failures} failed)",
            flush=True,
        )
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=["pause", "kill"], default="pause")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=2.5)
    opts = parser.parse_args(argv)
    results = [run_once(opts, n) for n in range(opts.runs)]
    worst_owner = max(r["owner_gap_s"] for r in results)
    worst_root = max(r["root_gap_s"] for r in results)
    print(
        f"worst over {opts.runs} runs: classic queue on another primary {worst_owner:.3f} s, "
        f"replicated queue on the root {worst_root:.3f} s (heartbeat timeout {opts.timeout} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
