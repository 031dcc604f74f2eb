"""Queues spread over a cluster: does a cluster of primaries deliver more than one server?

    python -m brokerd.bench.spread --repeat 2 --duration 6 --json spread.json
    python -m brokerd.bench.spread --durable --json spread-durable.json
    python -m brokerd.bench.spread --nodes 2 --json spread-2.json

Issue 23's benchmark. Starts, on free loopback ports and in temporary
directories, one standalone brokerd, a brokerd cluster of ``--nodes``
primaries (3 by default) and (unless ``--no-rabbitmq``) as many RabbitMQ
nodes joined into one cluster, and runs ``--queues`` copies of the queue
scenario of ``python -m brokerd.bench`` at once (one queue each, 250-byte
bodies, a no-ack consumer, publishers paced by confirms with
``--confirm-window`` in flight). Queue *i* is declared on server *i mod N*,
so it is owned there (brokerd's ``client-local`` placement of a classic
queue, RabbitMQ's default master and leader locator). With ``--layout
cross`` (the default) its publisher connects to server *i+1* and its
consumer to server *i+2*: every message crosses two links. With two servers
there is no third one: both connect to the server that does not own the
queue, so every message still crosses the link twice (there and back). With
``--layout local`` both connect to the owner. Set-ups, brokers alternating
run by run:

- brokerd, one server, every queue on it;
- brokerd cluster, classic queues (``x-queue-type: classic``; a transient
  queue without a type is classic too): spread over their owners;
- brokerd cluster, durable queues without a type (replicated, all on the
  root), transient messages;
- RabbitMQ cluster, classic queues (masters spread as declared);
- RabbitMQ node 1 alone.

``--durable`` measures the durable counterparts instead, every queue
durable and every message persistent (delivery mode 2), as issue 23 sets
them against each other:

- brokerd, one server;
- brokerd cluster, durable queues without a type (replicated, on its owner);
- RabbitMQ cluster, quorum queues (``x-queue-type: quorum``), leaders
  spread as declared;
- RabbitMQ node 1 alone, quorum queues of one member
  (``x-quorum-initial-group-size: 1``; the default group would take in the
  other nodes).

``--nodes 2`` runs two primaries and two RabbitMQ nodes against the same
one-server baselines: on a 2-core machine, one broker process per core.

``--durable --group-size N`` adds quorum queues of ``N`` members
(``x-quorum-initial-group-size``) on both clusters: brokerd copies each to
its group alone, as RabbitMQ does.

Prints a Markdown table of total deliveries per second with the ratios, and
stops everything. The set-up labels name the variant; the JSON report also
carries it (``variant``) and each set-up's arguments (``setups``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from brokerd.bench.client import ServerClosed
from brokerd.bench.cluster import GUEST, BrokerdCluster, RabbitCluster, write_report
from brokerd.bench.failover import Node
from brokerd.bench.frames import FrameError
from brokerd.bench.ports import free_port
from brokerd.bench.scenarios import SCENARIOS, BenchError, Options, Run

CLASSIC = {"x-queue-type": "classic"}
QUORUM = {"x-queue-type": "quorum"}
#: a quorum queue on its declaring node alone: in a cluster the default group
#: takes in up to three nodes, which would make "one node" a replicated set-up
QUORUM_ALONE = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}

# which servers a set-up runs on
SINGLE, BROKERD, RABBIT, RABBIT_ONE = "brokerd-single", "brokerd", "rabbitmq", "rabbitmq-one"


@dataclass(frozen=True)
class Setup:
    """One measured configuration; ``key`` names it for the ratios whatever its label."""

    key: str
    label: str
    servers: str
    arguments: dict[str, Any] | None = None
    #: durable queues, transient messages
    durable_queues: bool = False
    #: durable queues, persistent (delivery mode 2) messages
    persistent: bool = False


def quorum_of(size: int) -> dict[str, Any]:
    """A quorum queue's arguments with a group of ``size`` members."""
    return {"x-queue-type": "quorum", "x-quorum-initial-group-size": size}


def select_setups(nodes: int, durable: bool, rabbitmq: bool, group_size: int = 0) -> list[Setup]:
    """The set-ups of one invocation, in the order they run and are printed;
    ``group_size`` (durable only): quorum queues of that many members too."""
    if durable:
        setups = [
            Setup("one", "brokerd, one server, durable, persistent", SINGLE, persistent=True),
            Setup(
                "cluster",
                f"brokerd, {nodes} primaries, durable, no type (replicated, on its owner), "
                "persistent",
                BROKERD,
                persistent=True,
            ),
        ]
        if rabbitmq:
            setups += [
                Setup(
                    "rabbit",
                    f"RabbitMQ, {nodes} nodes, quorum queues spread, persistent",
                    RABBIT,
                    QUORUM,
                    persistent=True,
                ),
                Setup(
                    "rabbit-one",
                    "RabbitMQ, one node, quorum queues (group size 1), persistent",
                    RABBIT_ONE,
                    QUORUM_ALONE,
                    persistent=True,
                ),
            ]
        if group_size:
            setups.append(
                Setup(
                    "cluster-group",
                    f"brokerd, {nodes} primaries, quorum queues of {group_size} members, "
                    "persistent",
                    BROKERD,
                    quorum_of(group_size),
                    persistent=True,
                )
            )
            if rabbitmq:
                setups.append(
                    Setup(
                        "rabbit-group",
                        f"RabbitMQ, {nodes} nodes, quorum queues of {group_size} members, "
                        "persistent",
                        RABBIT,
                        quorum_of(group_size),
                        persistent=True,
                    )
                )
        return setups
    setups = [
        Setup("one", "brokerd, one server", SINGLE),
        Setup("cluster", f"brokerd, {nodes} primaries, classic queues spread", BROKERD, CLASSIC),
        Setup(
            "root",
            f"brokerd, {nodes} primaries, durable, no type (replicated, on its owner)",
            BROKERD,
            durable_queues=True,
        ),
    ]
    if rabbitmq:
        setups += [
            Setup("rabbit", f"RabbitMQ, {nodes} nodes, classic queues spread", RABBIT),
            Setup("rabbit-one", "RabbitMQ, one node", RABBIT_ONE),
        ]
    return setups


def ratio_names(nodes: int, durable: bool, group_size: int = 0) -> list[tuple[str, str, str]]:
    """(numerator key, denominator key, line) of the ratios printed after the table."""
    if durable:
        group = f"quorum of {group_size}"
        return [
            ("cluster", "rabbit", f"brokerd replicated / RabbitMQ {nodes} nodes quorum"),
            ("cluster", "one", "brokerd replicated / brokerd one server"),
            ("cluster", "rabbit-one", "brokerd replicated / RabbitMQ one node quorum"),
            ("rabbit", "rabbit-one", f"RabbitMQ {nodes} nodes / RabbitMQ one node"),
        ] + (
            [
                ("cluster-group", "rabbit-group", f"brokerd {group} / RabbitMQ {group}"),
                ("cluster-group", "cluster", f"brokerd {group} / brokerd replicated"),
                ("cluster-group", "one", f"brokerd {group} / brokerd one server"),
            ]
            if group_size
            else []
        )
    return [
        ("cluster", "one", "brokerd classic spread / brokerd one server"),
        ("cluster", "root", "brokerd classic spread / brokerd on the root"),
        ("cluster", "rabbit", f"brokerd classic spread / RabbitMQ {nodes} nodes classic"),
        ("cluster", "rabbit-one", "brokerd classic spread / RabbitMQ one node"),
        ("rabbit", "rabbit-one", f"RabbitMQ {nodes} nodes / RabbitMQ one node"),
    ]


def endpoints(index: int, servers: int, layout: str) -> tuple[int, int, int]:
    """Queue ``index``'s owner, publisher and consumer, as server indexes.

    ``cross`` keeps the publisher and the consumer off the owner so that every
    message travels twice between servers; with two servers both sit on the
    other one (else the consumer would land on the owner and save a hop).
    """
    owner = index % servers
    if layout == "local" or servers == 1:
        return owner, owner, owner
    publisher = (index + 1) % servers
    consumer = (index + 2) % servers if servers > 2 else publisher
    return owner, publisher, consumer


def build_runs(
    ports: list[int],
    opts: Options,
    queues: int,
    layout: str,
    arguments: dict[str, Any] | None,
    durable: bool = False,
    persistent: bool = False,
) -> list[Run]:
    """One queue scenario per queue, each declared on its owner at ``ports``."""
    runs: list[Run] = []
    for i in range(queues):
        owner, publisher, consumer = (ports[s] for s in endpoints(i, len(ports), layout))
        options = Options(
            **{
                **vars(opts),
                "publish_url": GUEST.format(port=publisher),
                "consume_url": GUEST.format(port=consumer),
                "queue_arguments": arguments,
                "durable_queues": durable,
                "persistent": persistent,
            }
        )
        runs.append(Run(GUEST.format(port=owner), SCENARIOS["queue-250"], options))
    return runs


def run_spread(
    ports: list[int],
    opts: Options,
    queues: int,
    layout: str,
    arguments: dict[str, Any] | None,
    durable: bool = False,
    persistent: bool = False,
) -> dict[str, Any]:
    """``queues`` queue scenarios at once over the servers at ``ports``; their total."""
    runs = build_runs(ports, opts, queues, layout, arguments, durable, persistent)
    results: list[dict[str, Any] | None] = [None] * queues
    errors: list[str] = []

    def one(index: int) -> None:
        try:
            results[index] = runs[index].run()
        except (BenchError, OSError, ServerClosed, FrameError) as exc:
            # a refused declare must fail the run, not leave a total of fewer queues
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


def add_run_options(p: argparse.ArgumentParser, repeat: int = 2) -> None:
    """The options of a run of queue scenarios at once (this module's and ``cores``)."""
    p.add_argument("--repeat", type=int, default=repeat, help="runs per set-up (median reported)")
    p.add_argument("--duration", type=float, default=6.0, help="measurement window, seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up, seconds")
    p.add_argument("--queues", type=int, default=6, help="queues (one publisher, one consumer)")
    p.add_argument("--confirm-window", type=int, default=1000, help="unconfirmed per publisher")


def print_medians(header: str, results: dict[str, list[dict[str, Any]]]) -> dict[str, float | None]:
    """A Markdown table of each set-up's median deliveries/s; the medians."""
    medians: dict[str, float | None] = {}
    print(f"| set-up ({header}) | deliveries/s | runs |")
    print("|---|---:|---:|")
    for label, runs in results.items():
        ok = [r["value"] for r in runs if "value" in r]
        medians[label] = statistics.median(ok) if ok else None
        shown = "-" if medians[label] is None else f"{medians[label]:,.0f}"
        print(f"| {label} | {shown} | {len(ok)} |")
    return medians


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--nodes`` below 2 is refused (it would be no cluster)."""
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench.spread",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(p)
    p.add_argument("--layout", choices=["cross", "local"], default="cross")
    p.add_argument(
        "--nodes",
        type=int,
        default=3,
        help="brokerd primaries and RabbitMQ nodes in the clusters (default 3; 2 for one "
        "broker per core on a 2-core machine)",
    )
    p.add_argument(
        "--durable",
        action="store_true",
        help="durable queues, persistent messages: brokerd one server and replicated "
        "queues against RabbitMQ quorum queues (spread, and on one node)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=0,
        help="with --durable: quorum queues of this many members too, on both clusters",
    )
    p.add_argument("--no-rabbitmq", action="store_true", help="brokerd only")
    p.add_argument("--json", metavar="OUT.json", default=None)
    args = p.parse_args(argv)
    if args.nodes < 2:
        p.error("--nodes must be 2 or more (the one-server set-ups are always measured)")
    if args.group_size and not args.durable:
        p.error("--group-size needs --durable (quorum queues are durable)")
    if args.group_size < 0:
        p.error("--group-size must be positive")
    return args


def variant(args: argparse.Namespace) -> str:
    """What ran, in words, for the table header and the JSON report."""
    kind = "durable, persistent" if args.durable else "transient"
    group = f", quorum groups of {args.group_size}" if args.group_size else ""
    return f"{kind}, {args.nodes} nodes, layout {args.layout}{group}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    opts = Options(duration=args.duration, warmup=args.warmup, confirm_window=args.confirm_window)
    setups = select_setups(args.nodes, args.durable, not args.no_rabbitmq, args.group_size)
    base = Path(tempfile.mkdtemp(prefix="rookery-bench-spread-"))
    single = Node(base / "single", 0, free_port(), None)
    brokerd = BrokerdCluster(base / "brokerd", args.nodes)
    rabbit = None if args.no_rabbitmq else RabbitCluster(base / "rabbitmq", args.nodes)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        single.start()
        brokerd.start()
        if rabbit is not None:
            rabbit.start()
        time.sleep(1.0)
        ports = {SINGLE: [single.port], BROKERD: brokerd.ports}
        if rabbit is not None:
            ports |= {RABBIT: rabbit.ports, RABBIT_ONE: rabbit.ports[:1]}
        for _ in range(args.repeat):
            for setup in setups:
                print(f"bench: {setup.label} ...", file=sys.stderr, flush=True)
                result = run_spread(
                    ports[setup.servers],
                    opts,
                    args.queues,
                    args.layout,
                    setup.arguments,
                    setup.durable_queues,
                    setup.persistent,
                )
                print(f"bench:   {result.get('value', result.get('error'))}", file=sys.stderr)
                results.setdefault(setup.label, []).append(result)
    finally:
        single.stop()
        brokerd.stop()
        if rabbit is not None:
            rabbit.stop()
    header = f"{args.queues} queues, layout {args.layout}"
    if args.durable:
        header += ", durable, persistent"
    medians = print_medians(header, results)
    by_key = {s.key: medians.get(s.label) for s in setups}
    print()
    for top, bottom, line in ratio_names(args.nodes, args.durable, args.group_size):
        if top in by_key and bottom in by_key:
            a, b = by_key[top], by_key[bottom]
            print(f"{line}: {a / b:.2f}" if a and b else f"{line}: -")
    if args.json:
        write_report(
            args.json,
            "python -m brokerd.bench.spread",
            vars(args),
            results,
            medians,
            extra={"variant": variant(args), "setups": [asdict(s) for s in setups]},
        )
    shutil.rmtree(base, ignore_errors=True)
    return 0 if all("value" in r for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
