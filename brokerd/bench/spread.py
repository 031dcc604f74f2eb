"""Queues spread over a cluster: does a three-server cluster deliver more than one server?

    python -m brokerd.bench.spread --repeat 2 --duration 6 --json spread.json

Issue 23's benchmark. Starts, on free loopback ports and in temporary
directories, one standalone brokerd, a brokerd cluster of three primaries and
(unless ``--no-rabbitmq``) three RabbitMQ nodes joined into one cluster, and
runs ``--queues`` copies of the queue scenario of ``python -m brokerd.bench``
at once (one queue each, 250-byte bodies, a no-ack consumer, publishers paced
by confirms with ``--confirm-window`` in flight). Queue *i* is declared on
server *i mod 3*, so it is owned there (brokerd's ``client-local`` placement
of a classic queue, RabbitMQ's default master locator). With ``--layout
cross`` (the default) its publisher connects to server *i+1* and its consumer
to server *i+2*: every message crosses two links. With ``--layout local`` both
connect to the owner. Set-ups, brokers alternating run by run:

- brokerd, one server, every queue on it;
- brokerd cluster, classic queues (``x-queue-type: classic``; a transient
  queue without a type is classic too): spread over their owners;
- brokerd cluster, durable queues without a type (replicated, all on the
  root), transient messages;
- RabbitMQ cluster, classic queues (masters spread as declared);
- RabbitMQ node 1 alone.

Prints a Markdown table of total deliveries per second with the ratios, and
stops everything.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from brokerd.bench.cluster import GUEST, BrokerdCluster, RabbitCluster, write_report
from brokerd.bench.failover import Node
from brokerd.bench.ports import free_port
from brokerd.bench.scenarios import SCENARIOS, BenchError, Options, Run

CLASSIC = {"x-queue-type": "classic"}


def run_spread(
    ports: list[int],
    opts: Options,
    queues: int,
    layout: str,
    arguments: dict[str, Any] | None,
    durable: bool = False,
) -> dict[str, Any]:
    """``queues`` queue scenarios at once over the servers at ``ports``; their total."""
    n = len(ports)
    runs: list[Run] = []
    for i in range(queues):
        owner = ports[i % n]
        publisher = owner if layout == "local" else ports[(i + 1) % n]
        consumer = owner if layout == "local" else ports[(i + 2) % n]
        options = Options(
            **{
                **vars(opts),
                "publish_url": GUEST.format(port=publisher),
                "consume_url": GUEST.format(port=consumer),
                "queue_arguments": arguments,
                "durable_queues": durable,
            }
        )
        runs.append(Run(GUEST.format(port=owner), SCENARIOS["queue-250"], options))
    results: list[dict[str, Any] | None] = [None] * queues
    errors: list[str] = []

    def one(index: int) -> None:
        try:
            results[index] = runs[index].run()
        except (BenchError, OSError) as exc:
            errors.append(f"queue {index}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(queues)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    if errors:
        return {"error": "; ".join(errors)}
    done = [r for r in results if r is not None]
    return {
        "value": round(sum(r["value"] for r in done), 1),
        "publish_rate": round(sum(r["publish_rate"] for r in done), 1),
        "per_queue": [r["value"] for r in done],
        "nacked": sum(r["nacked"] for r in done),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench.spread",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repeat", type=int, default=2, help="runs per set-up (median reported)")
    p.add_argument("--duration", type=float, default=6.0, help="measurement window, seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up, seconds")
    p.add_argument("--queues", type=int, default=6, help="queues (one publisher, one consumer)")
    p.add_argument("--confirm-window", type=int, default=1000, help="unconfirmed per publisher")
    p.add_argument("--layout", choices=["cross", "local"], default="cross")
    p.add_argument("--no-rabbitmq", action="store_true", help="brokerd only")
    p.add_argument("--json", metavar="OUT.json", default=None)
    args = p.parse_args(argv)
    opts = Options(duration=args.duration, warmup=args.warmup, confirm_window=args.confirm_window)
    base = Path(tempfile.mkdtemp(prefix="rookery-bench-spread-"))
    single = Node(base / "single", 0, free_port(), None)
    brokerd = BrokerdCluster(base / "brokerd")
    rabbit = None if args.no_rabbitmq else RabbitCluster(base / "rabbitmq")
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        single.start()
        brokerd.start()
        if rabbit is not None:
            rabbit.start()
        time.sleep(1.0)
        setups: list[tuple[str, list[int], dict[str, Any] | None, bool]] = [
            ("brokerd, one server", [single.port], None, False),
            ("brokerd, 3 primaries, classic queues spread", brokerd.ports, CLASSIC, False),
            (
                "brokerd, 3 primaries, durable, no type (replicated, on the root)",
                brokerd.ports,
                None,
                True,
            ),
        ]
        if rabbit is not None:
            setups += [
                ("RabbitMQ, 3 nodes, classic queues spread", rabbit.ports, None, False),
                ("RabbitMQ, one node", rabbit.ports[:1], None, False),
            ]
        for _ in range(args.repeat):
            for label, ports, arguments, durable in setups:
                print(f"bench: {label} ...", file=sys.stderr, flush=True)
                result = run_spread(ports, opts, args.queues, args.layout, arguments, durable)
                print(f"bench:   {result.get('value', result.get('error'))}", file=sys.stderr)
                results.setdefault(label, []).append(result)
    finally:
        single.stop()
        brokerd.stop()
        if rabbit is not None:
            rabbit.stop()
    medians: dict[str, float | None] = {}
    print(f"| set-up ({args.queues} queues, layout {args.layout}) | deliveries/s | runs |")
    print("|---|---:|---:|")
    for label, runs in results.items():
        ok = [r["value"] for r in runs if "value" in r]
        medians[label] = statistics.median(ok) if ok else None
        shown = "-" if medians[label] is None else f"{medians[label]:,.0f}"
        print(f"| {label} | {shown} | {len(ok)} |")
    labels = list(medians)

    def ratio(a: int, b: int) -> str:
        if len(labels) > max(a, b) and medians[labels[a]] and medians[labels[b]]:
            return f"{medians[labels[a]] / medians[labels[b]]:.2f}"  # type: ignore[operator]
        return "-"

    print(f"\nbrokerd classic spread / brokerd one server: {ratio(1, 0)}")
    print(f"brokerd classic spread / brokerd on the root: {ratio(1, 2)}")
    if rabbit is not None:
        print(f"brokerd classic spread / RabbitMQ 3 nodes classic: {ratio(1, 3)}")
        print(f"RabbitMQ 3 nodes / RabbitMQ one node: {ratio(3, 4)}")
    if args.json:
        write_report(args.json, "python -m brokerd.bench.spread", vars(args), results, medians)
    shutil.rmtree(base, ignore_errors=True)
    return 0 if all("value" in r for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
