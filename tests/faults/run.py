"""One fault-injection run: cluster, workload, nemesis, drain, check.

Phases: start 3 primaries and a secondary (the harness's heartbeat
settings), declare the shared queues, start the clients spread over every
server (flood publishers too, in flood mode), warm up, apply the planned
faults one by one, stop the publishers, undo every fault and wait for a
settled root, let the consumers empty the queues until nothing arrives for
``quiet`` seconds, sweep what is left with basic.get, and check the history.
Every process is stopped on the way out, whatever happened;
``Outcome.leftover`` says if one was not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster_harness import INTERVAL, TIMEOUT, Cluster
from tests.faults import owners
from tests.faults.checker import Report, check
from tests.faults.history import History, Recorder
from tests.faults.nemesis import KINDS, Nemesis, schedule
from tests.faults.stalls import StallWatch
from tests.faults.workload import (
    Client,
    Consumer,
    Endpoint,
    Flooder,
    Publisher,
    declare,
    depths,
    sweep,
)
from tests.support.netbed import NetBed


@dataclass
class RunConfig:
    seed: int = 1
    faults: int = 7
    kinds: tuple[str, ...] = KINDS
    publishers: int = 4
    consumers: int = 4
    queues: int = 2
    rate: float = 40.0  # per publisher, messages per second
    #: per consumer until the drain: below the publishers' total, so the queues hold a backlog
    consume_rate: float | None = 25.0
    prefetch: int = 32
    durable: bool = False  # persistent messages (the queues are always durable: replicated)
    #: "classic": the queues are classic, spread over the primaries (``durable`` needed);
    #: "quorum": quorum queues, of ``group_size`` members (0: RabbitMQ's default, 3)
    queue_type: str = ""
    group_size: int = 0
    pad: int = 64  # body bytes beyond the publisher:seq prefix
    warmup: float = 2.0
    quiet: float = 2.0  # the drain ends when nothing arrived for this long
    drain_timeout: float = 45.0
    settle_timeout: float = 20.0
    interval: float = INTERVAL
    timeout: float = TIMEOUT
    #: flood mode (0: off): unconfirmed publishers at up to ``flood_rate`` messages a
    #: second each, bodies of ``flood_size`` bytes. Their backlog outgrows consumers
    #: limited to ``consume_rate``: the command line lifts that limit with ``--flood``.
    flood_publishers: int = 0
    flood_rate: float = 2000.0
    flood_size: int = 128
    #: each server in its own network namespace (tests/support/netbed.py): the network
    #: faults can be drawn, and clients reach the servers through a real bridge
    netbed: bool = False
    #: at most this many stall dumps (``stalls.py``: every server's state while a
    #: confirm waited past ``stall_after`` seconds); 0: none
    stall_dumps: int = 0
    stall_after: float = 1.5


@dataclass
class Outcome:
    history: History
    report: Report
    #: the harness's view of every server and the warnings in their logs, at the end
    describe: str = ""
    logs: list[str] = field(default_factory=list)
    #: pids of brokerd processes still running after the cleanup (must be none)
    leftover: list[int] = field(default_factory=list)
    #: client threads still running after the cleanup (must be none)
    stuck_clients: list[str] = field(default_factory=list)
    #: clients whose server indexes are not the harness's (must be none: every
    #: per-server figure and the kill-*-server targets rest on them)
    misnumbered: list[str] = field(default_factory=list)

    @property
    def crashes(self) -> list[dict[str, float | int | None]]:
        """Servers that exited without being killed (must be none)."""
        return list(self.history.meta.get("crashes", []))


def owner_overlaps(cluster: Cluster) -> list[owners.Overlap]:
    """Owners that confirmed after their successor began to (``owners.py``)."""
    found, points = [], []
    for node in cluster.nodes:
        if node.process is not None:
            text = node.process.log_text()
            found += owners.marks(f"[{node.index}]", text)
            points += owners.fences(text)
    return owners.overlaps(found, points)


def run(config: RunConfig, base: Path, log: Callable[[str], None] = print) -> Outcome:
    """One run in ``base`` (data directories and logs stay there)."""
    bed = NetBed(4) if config.netbed else None
    if bed is not None:
        bed.start()
    cluster = Cluster(
        base,
        primaries=3,
        secondaries=1,
        interval=config.interval,
        timeout=config.timeout,
        netbed=bed,
        slow_links=config.netbed,
    )
    recorder = Recorder()
    history = recorder.history
    queues = [f"jepsen-{i}" for i in range(config.queues)]
    servers = len(cluster.nodes)
    publishers = [
        Publisher(
            f"p{i}",
            cluster.endpoints,
            i,
            recorder,
            queues,
            rate=config.rate,
            durable=config.durable,
            pad=config.pad,
        )
        for i in range(config.publishers)
    ]
    # consumers start one server further on than the publishers of the same number
    consumers = [
        Consumer(
            f"c{i}",
            cluster.endpoints,
            i + 1,
            recorder,
            queues[i % len(queues)],
            prefetch=config.prefetch,
            rate=config.consume_rate,
        )
        for i in range(config.consumers)
    ]
    # flood publishers start two servers further on than the publishers of the same number
    flooders = [
        Flooder(
            f"f{i}",
            cluster.endpoints,
            i + 2,
            recorder,
            queues,
            rate=config.flood_rate,
            size=config.flood_size,
            durable=config.durable,
        )
        for i in range(config.flood_publishers)
    ]
    senders: list[Client] = [*publishers, *flooders]
    clients: list[Client] = [*senders, *consumers]
    plan = schedule(config.seed, config.faults, config.kinds, config.timeout)
    history.meta = {"config": config.__dict__ | {"kinds": list(config.kinds)}, "servers": servers}
    describe = ""
    nemesis: Nemesis | None = None
    watch = None
    if config.stall_dumps:
        watch = StallWatch(
            cluster, publishers, base, limit=config.stall_dumps, after=config.stall_after
        )
    try:
        cluster.start_all()
        # fresh servers are numbered by seniority once they are up (``start_all``),
        # each keeping its address: the clients were made with the addresses in spawn
        # order, so they take them again now, or a client's server index (in its
        # publishes and deliveries, and the target of kill-publisher-server and
        # kill-consumer-server) names another server than the harness's index does
        for client in clients:
            client.ports = list(cluster.endpoints)
        cluster.wait_until(cluster.settled_root, timeout=30, what="a settled root")
        declare(cluster.primary_endpoints, queues, config.queue_type, config.group_size)
        for client in clients:
            client.start()
        time.sleep(config.warmup)
        if watch is not None:
            watch.start()
        nemesis = Nemesis(
            cluster,
            recorder,
            publishers,
            consumers,
            queues=queues,
            settle_timeout=config.settle_timeout,
            log=lambda line: log(f"[{len(history.faults)}/{len(plan)}] {line}"),
        )
        for planned in plan:
            nemesis.apply(planned)
        history.drain_start = time.time()
        for sender in senders:
            sender.halt()
        for sender in senders:
            sender.join(15)
        for consumer in consumers:
            consumer.rate = None
        nemesis.undo_everything()
        cluster.wait_until(cluster.settled_root, timeout=30, what="a settled root for the drain")
        history.drained = drain(cluster.endpoints, queues, consumers, recorder, config)
        swept = sweep(cluster.endpoints, queues, recorder)
        history.drain_end = time.time()
        history.meta["swept"] = swept
        log(f"drain {'done' if history.drained else 'TIMED OUT'}, {swept} left for the sweep")
        if flooders:
            written = sum(len(s.sent) for f in flooders for s in f.record.sessions)
            sessions = sum(len(f.record.sessions) for f in flooders)
            log(f"flood: {written} written unconfirmed over {sessions} connections")
    except BaseException:
        describe = cluster.describe()
        raise
    finally:
        if watch is not None:
            watch.halt()
            if watch.ident is not None:
                watch.join(10)
            history.meta["stall_dumps"] = [str(p) for p in watch.written]
        for client in clients:
            client.halt()
        for client in clients:
            if client.ident is not None:  # started
                client.join(10)
        history.meta["client_errors"] = {c.name: dict(c.errors) for c in clients}
        history.meta["slowest_confirm"] = max((p.slowest for p in publishers), default=0.0)
        history.meta["root_overlaps"] = len(cluster.root_overlaps())
        overlaps = owner_overlaps(cluster)
        history.meta["owner_overlaps"] = [str(o) for o in overlaps if not o.held]
        history.meta["owner_overlaps_held"] = [str(o) for o in overlaps if o.held]
        history.meta["crashes"] = nemesis.crashes if nemesis is not None else []
        describe = describe or cluster.describe()
        cluster.close()
        if bed is not None:
            bed.close()
    return Outcome(
        history,
        check(history),
        describe=describe,
        logs=[str(n.process.log_path) for n in cluster.nodes if n.process is not None],
        leftover=[
            n.process.proc.pid
            for n in cluster.nodes
            if n.process is not None and n.process.proc is not None and n.alive()
        ],
        stuck_clients=[c.name for c in clients if c.is_alive()],
        misnumbered=[c.name for c in clients if c.ports != cluster.endpoints[: len(c.ports)]],
    )


def drain(
    ports: list[Endpoint],
    queues: list[str],
    consumers: list[Consumer],
    recorder: Recorder,
    config: RunConfig,
) -> bool:
    """Consume until every consumer is attached, the queues are empty and nothing
    arrived for ``quiet`` seconds; False if that did not happen in time."""
    deadline = time.monotonic() + config.drain_timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if not all(c.consuming for c in consumers):
            continue
        if time.time() - recorder.last_delivery < config.quiet:
            continue
        counts = depths(ports, queues)
        if counts is not None and not any(counts.values()):
            return True
    return False
