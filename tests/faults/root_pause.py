"""What a root pause shorter than the heartbeat timeout costs a confirmed publisher.

    python -m tests.faults.root_pause --pause 2.7 --runs 5

Three primaries with the default heartbeat (1.0 s / 3.0 s unless told), a
confirmed publisher on a server that is not the root. Each run SIGSTOPs the
root for ``--pause`` seconds at a random moment and reports the worst gap
between two confirms and whether the root changed. Issue 21: a pause shorter
than the timeout must cost no more than the pause itself.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import threading
import time

import pika

from tests.cluster_harness import Cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pause", type=float, default=2.7)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=3.0)
    opts = parser.parse_args(argv)
    with Cluster.temporary(
        "rookery-root-pause-", 3, 0, interval=opts.interval, timeout=opts.timeout
    ) as cluster:
        return run(cluster, opts)


def run(cluster: Cluster, opts: argparse.Namespace) -> int:
    cluster.start_settled()
    publisher = 2
    conn = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", cluster.ports[publisher], blocked_connection_timeout=60
        )
    )
    channel = conn.channel()
    channel.queue_declare("root-pause", durable=True)
    channel.confirm_delivery()
    worst_all = 0.0
    for run in range(opts.runs):
        root = cluster.root_index()
        before = cluster.spid(root)
        if root == publisher:
            print(f"run {run}: the publisher's server is root; skipped")
            continue
        gaps: list[float] = []
        last = time.monotonic()
        pause_at = last + 1.0 + random.random() * opts.interval
        end = pause_at + opts.pause + 2.0
        paused = False
        while time.monotonic() < end:
            if not paused and time.monotonic() >= pause_at:
                cluster.pause(root)
                threading.Timer(opts.pause, cluster.resume, args=(root,)).start()
                paused = True
            with contextlib.suppress(pika.exceptions.NackError):  # counted as a gap end
                channel.basic_publish("", "root-pause", b"x")
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        after = cluster.wait_until(cluster.settled_root, timeout=30, what="a root")
        worst = max(gaps)
        worst_all = max(worst_all, worst)
        change = "same root" if after == before else "root changed"
        print(f"run {run}: pause {opts.pause:.1f}s, worst confirm gap {worst:.2f}s, {change}")
        time.sleep(1.0)
    conn.close()
    print(f"worst confirm gap over {opts.runs} runs: {worst_all:.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
