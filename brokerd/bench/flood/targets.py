"""Starting what the flood runs against: three brokerd primaries, one brokerd, a
``brokerd --workers N`` host, or RabbitMQ.

The process starters (``bench.cluster``, ``bench.failover``) are imported
lazily, inside the starters, so importing this module loads no broker code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brokerd.bench.failover import Node

GUEST = "amqp://guest:guest@127.0.0.1:{port}/"


@dataclass
class Target:
    """A running broker set-up: its servers' URLs, logs and how to stop it."""

    kind: str
    label: str
    urls: list[str]
    #: per server: a label and its log file (brokerd only)
    servers: list[str]
    logs: list[Path | None]
    nodes: list[Node] = field(default_factory=list)
    stop: Callable[[], None] = lambda: None


def _log_at_info(node: Node) -> None:
    """bench.failover.Node starts brokerd at ``--log-level warning``; the flood wants the
    info lines (connections closed and lost, replicas joining) around the signatures."""
    cmd = node.cmd
    cmd[cmd.index("--log-level") + 1] = "info"


def start_cluster(base: Path) -> Target:
    from brokerd.bench.cluster import BrokerdCluster

    cluster = BrokerdCluster(base)
    for node in cluster.nodes:
        _log_at_info(node)
    target = Target(
        "cluster",
        "brokerd cluster (3 primaries)",
        [GUEST.format(port=p) for p in cluster.ports],
        [f"n{i}:{p}" for i, p in enumerate(cluster.ports)],
        [n.data_dir / "brokerd.log" for n in cluster.nodes],
        list(cluster.nodes),
        cluster.stop,
    )
    try:
        root = cluster.start()
    except BaseException:
        cluster.stop()
        raise
    print(f"flood: brokerd cluster up, root {root}", file=sys.stderr, flush=True)
    return target


def start_single(base: Path) -> Target:
    from brokerd.bench.failover import Node, free_port, wait_for

    node = Node(base, 0, free_port(), None)
    _log_at_info(node)
    target = Target(
        "single",
        "brokerd single server",
        [node.url],
        [f"n0:{node.port}"],
        [node.data_dir / "brokerd.log"],
        [node],
        node.stop,
    )
    node.start()
    if not wait_for(lambda: (node.status() or {}).get("ready"), 30.0, 0.1):
        node.stop()
        raise RuntimeError("the standalone brokerd did not become ready in 30 s")
    return target


def start_workers(base: Path, workers: int) -> Target:
    """One ``brokerd --workers N`` host: every client on its one port, where the kernel
    puts it (and each connection may move to its queue's worker)."""
    from brokerd.bench.cores import Host

    host = Host(base, workers)
    _log_at_info(host.node)
    target = Target(
        "workers",
        f"brokerd --workers {workers} (one port)",
        [host.node.url],
        [f"host:{host.port}"],
        [host.node.data_dir / "brokerd.log"],
        [],  # the status sampler reads one control socket; a host has one per worker
        host.stop,
    )
    try:
        host.start()
    except BaseException:
        host.stop()
        raise
    return target


def start_rabbitmq(base: Path) -> Target | None:
    from brokerd.bench.cluster import RabbitCluster

    rabbit = RabbitCluster(base)
    if not rabbit._bin("rabbitmq-server").exists():
        print(
            "flood: --rabbitmq skipped: rabbitmq-server is not installed "
            "(apt-get install rabbitmq-server)",
            file=sys.stderr,
        )
        return None
    try:
        rabbit.start()
    except BaseException:
        rabbit.stop()
        raise
    return Target(
        "rabbitmq",
        "RabbitMQ cluster (3 nodes)",
        [GUEST.format(port=p) for p in rabbit.ports],
        list(rabbit.nodes),
        [None] * len(rabbit.nodes),
        [],
        rabbit.stop,
    )
