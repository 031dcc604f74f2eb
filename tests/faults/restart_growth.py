"""Restart growth (issue 43): does a cluster's state grow with one server's restarts?

    python -m tests.faults.restart_growth --restarts 200 --json growth.json

A three-primary cluster with a durable replicated queue holding a few
messages; one primary (never the root's) is stopped and started again
``--restarts`` times, alternating a planned stop (SIGTERM) with kill -9, each
time waiting until every server is ready again. After every ``--every``
restarts the runner records, on the other two servers, how many peer records
membership holds (``ctl status``: current peers plus the spids they replace)
and the size of ``ctl status`` and of the state dump in bytes. A server
forgets an earlier run some heartbeat timeouts after it last heard it, so the
figures rise over the first restarts and then hold. The verdict: at the end
they are within what the first half of the run reached (``--slack`` records,
25 % of the sizes), and the queue still holds its messages.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pika

from tests.cluster_harness import Cluster

QUEUE = "growth"
MESSAGES = 20


def records(view: dict[str, Any]) -> int:
    """Peer records a server keeps: each current peer and the runs it replaced."""
    return sum(1 + len(p.get("replaces") or []) for p in view["peers"])


def sample(cluster: Cluster, watched: list[int], restarts: int) -> dict[str, Any]:
    row: dict[str, Any] = {"restarts": restarts}
    for index in watched:
        view = cluster.status(index, timeout=5)
        assert view is not None, f"server {index} does not answer"
        dump = cluster.ctl(index, "dump")["dump"]
        row[f"s{index}"] = {
            "records": records(view),
            "status_bytes": len(json.dumps(view)),
            "dump_bytes": len(dump),
        }
    return row


def depth(cluster: Cluster, index: int) -> int:
    host, port = cluster.endpoints[index]
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    try:
        return conn.channel().queue_declare(QUEUE, durable=True, passive=True).method.message_count
    finally:
        conn.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    with Cluster.temporary("rookery-growth-", 3, 0) as cluster:
        cluster.start_all()
        root = cluster.index_of(cluster.wait_until(cluster.settled_root, timeout=30))
        assert root is not None
        host, port = cluster.endpoints[root]
        conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(MESSAGES):
            ch.basic_publish("", QUEUE, b"g%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
        victim = next(i for i in range(3) if i != root)
        watched = [i for i in range(3) if i != victim]
        samples = [sample(cluster, watched, 0)]
        began = time.monotonic()
        for n in range(1, args.restarts + 1):
            if n % 2:
                cluster.kill(victim)
            else:
                node = cluster.nodes[victim]
                assert node.process is not None and node.process.proc is not None
                node.process.proc.send_signal(signal.SIGTERM)
                node.process.proc.wait(30)
            cluster.start(victim)
            cluster.wait_until(cluster.agreed_root, timeout=30, what=f"ready after restart {n}")
            if n % args.every == 0 or n == args.restarts:
                samples.append(sample(cluster, watched, n))
                print(json.dumps(samples[-1]), flush=True)
        # a server forgets an earlier run some heartbeat timeouts after it was last
        # heard: records rise over the first restarts, then hold; so the second
        # half of the run must stay within what the first half reached
        half = [row for row in samples if row["restarts"] <= args.restarts // 2]
        last = samples[-1]
        grown = {}
        for key in (k for k in last if k != "restarts"):
            reached = {m: max(row[key][m] for row in half) for m in last[key]}
            grown[key] = {
                "records": last[key]["records"] - reached["records"],
                "status": round(last[key]["status_bytes"] / reached["status_bytes"], 3),
                "dump": round(last[key]["dump_bytes"] / reached["dump_bytes"], 3),
            }
        kept = depth(cluster, watched[0])
        ok = kept == MESSAGES and all(
            g["records"] <= args.slack and g["status"] <= 1.25 and g["dump"] <= 1.25
            for g in grown.values()
        )
        return {
            "restarts": args.restarts,
            "seconds": round(time.monotonic() - began, 1),
            "samples": samples,
            "grown": grown,
            "queue_depth": kept,
            "ok": ok,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=200)
    parser.add_argument("--every", type=int, default=20, help="restarts between samples")
    parser.add_argument("--slack", type=int, default=2, help="peer records allowed to grow")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    tempfile.tempdir = tempfile.gettempdir()
    sys.exit(main())
