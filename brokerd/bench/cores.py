"""One host's cores: does ``brokerd --workers N`` deliver more than one worker?

    python -m brokerd.bench.cores --repeat 3                 # --workers 2 and 1, one RabbitMQ node
    python -m brokerd.bench.cores --durable --repeat 3       # durable queues, persistent messages
    python -m brokerd.bench.cores --queues 1 --no-rabbitmq   # one queue, clients wherever they land
    python -m brokerd.bench.cores --curve --no-rabbitmq      # --workers 1, 2, 4, ..., cores

Issue 40's benchmark. Starts, on free loopback ports and in temporary
directories, one ``brokerd --workers N`` host for each N asked, and (unless
``--no-rabbitmq``) one RabbitMQ node, then runs ``--queues`` copies of the
queue scenario of ``python -m brokerd.bench`` at once (one queue each,
250-byte bodies unless ``--body-size``, a no-ack consumer, publishers paced
by confirms with ``--confirm-window`` in flight). Every client connects to
the host's one port, so which worker a connection reaches is the kernel's
choice (``SO_REUSEPORT``), as it is for a user's clients; the queues are
placed ``balanced`` over the workers, so a publisher or consumer lands on its
queue's worker one time in N, and otherwise moves there at its first publish
or consume.
Set-ups alternate run by run; the median of ``--repeat`` runs is reported.

How the figures should grow with cores: each worker is one process with its
own event loop, so with W workers on C cores the host's capacity grows
about as min(W, C) times one worker's. A client lands on its queue's worker
one time in W, then moves there at its first consume or publish
(``brokerd/protocol/moving.py``), so with balanced queues each worker serves
its own queues' clients and no message crosses a local link: the curve
should stay close to linear until the load generators themselves run out
of cores. On this 2-core machine the benchmark's publisher and consumer
processes share the cores with the workers, so ``--workers 2`` reaches
about 1.8x, not 2x; on a machine with more cores than the workers and the
load generators need, the curve is the one to read. Clients that cannot
move (TLS, or busy at their first consume or publish) pay one hop on the
local link per message, which costs most of what the local path does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from brokerd.bench.cluster import RabbitCluster, write_report
from brokerd.bench.failover import Node
from brokerd.bench.ports import free_port
from brokerd.bench.scenarios import BenchError, Options
from brokerd.bench.spread import add_run_options, print_medians, run_spread
from brokerd.server.control import request

RABBIT = "rabbitmq-one"


def workers_label(count: int) -> str:
    return f"brokerd --workers {count}"


class Host:
    """One ``brokerd --workers N`` process tree on its own port."""

    def __init__(self, base: Path, workers: int) -> None:
        self.workers = workers
        self.node = Node(base, workers, free_port(), None, extra=["--workers", str(workers)])

    @property
    def port(self) -> int:
        return self.node.port

    def start(self, timeout: float = 60.0) -> None:
        self.node.start()
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.node.proc is not None and self.node.proc.poll() is not None:
                raise BenchError(f"brokerd --workers {self.workers} exited at start")
            if time.monotonic() > deadline:
                raise BenchError(f"brokerd --workers {self.workers} not ready in {timeout:.0f}s")
            time.sleep(0.2)

    def ready(self) -> bool:
        """Every worker answers its control socket and (with several) follows a root."""
        if self.workers == 1:
            return self.node.status() is not None
        for index in range(self.workers):
            try:
                reply = request(self.node.data_dir / f"worker-{index}", "status", timeout=0.5)
            except (OSError, ValueError):
                return False
            status = reply.get("result") if reply.get("ok") else None
            if not status or not status.get("ready"):
                return False
        return True

    def stop(self) -> None:
        self.node.stop()


def counts(args: argparse.Namespace) -> list[int]:
    """The worker counts to measure: ``--workers``, or 1, 2, 4, ... up to the cores."""
    if not args.curve:
        return sorted(set(args.workers))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    steps, n = [], 1
    while n < (cores or 1):
        steps.append(n)
        n *= 2
    return [*steps, cores or 1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench.cores",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(p, repeat=3)
    p.add_argument("--body-size", type=int, default=250, help="message body, bytes")
    p.add_argument(
        "--workers",
        type=int,
        action="append",
        default=None,
        help="a worker count to measure; repeat for several (default: 1 and 2)",
    )
    p.add_argument(
        "--curve",
        action="store_true",
        help="--workers 1, 2, 4, ... and the machine's cores, in one go",
    )
    p.add_argument("--durable", action="store_true", help="durable queues, persistent messages")
    p.add_argument("--no-rabbitmq", action="store_true", help="brokerd only")
    p.add_argument("--json", metavar="OUT.json", default=None)
    args = p.parse_args(argv)
    if args.workers is None:
        args.workers = [1, 2]
    if any(not 1 <= n <= 256 for n in args.workers):
        p.error("--workers must be 1..256")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    opts = Options(
        duration=args.duration,
        warmup=args.warmup,
        confirm_window=args.confirm_window,
        body_size=args.body_size,
    )
    base = Path(tempfile.mkdtemp(prefix="rookery-bench-cores-"))
    hosts = {workers_label(n): Host(base / "brokerd", n) for n in counts(args)}
    rabbit = None if args.no_rabbitmq else RabbitCluster(base / "rabbitmq", 1)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for host in hosts.values():
            host.start()
        if rabbit is not None:
            rabbit.start()
        ports = {label: host.port for label, host in hosts.items()}
        if rabbit is not None:
            ports[RABBIT] = rabbit.ports[0]
        for _ in range(args.repeat):
            for label, port in ports.items():
                print(f"bench: {label} ...", file=sys.stderr, flush=True)
                result = run_spread(
                    [port], opts, args.queues, "local", None, args.durable, args.durable
                )
                print(f"bench:   {result.get('value', result.get('error'))}", file=sys.stderr)
                results.setdefault(label, []).append(result)
    finally:
        for host in hosts.values():
            with contextlib.suppress(Exception):
                host.stop()
        if rabbit is not None:
            rabbit.stop()
    kind = "durable, persistent" if args.durable else "transient"
    medians = print_medians(f"{args.queues} queues, {kind}, {args.body_size} B", results)
    print()
    one = medians.get(workers_label(1))
    for label, value in medians.items():
        if label == workers_label(1) or label == RABBIT or not value:
            continue
        if one:
            print(f"{label} / --workers 1: {value / one:.2f}")
        if medians.get(RABBIT):
            print(f"{label} / one RabbitMQ node: {value / medians[RABBIT]:.2f}")  # type: ignore[operator]
    if one and medians.get(RABBIT):
        print(f"--workers 1 / one RabbitMQ node: {one / medians[RABBIT]:.2f}")  # type: ignore[operator]
    if args.json:
        write_report(args.json, "python -m brokerd.bench.cores", vars(args), results, medians)
    shutil.rmtree(base, ignore_errors=True)
    return 0 if all("value" in r for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
