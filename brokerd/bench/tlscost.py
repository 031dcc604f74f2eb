"""What TLS costs: AMQPS against plain AMQP, brokerd against RabbitMQ, and TLS links.

    python -m brokerd.bench.tlscost --repeat 3 --duration 6 --json tls.json

Issue 24's benchmark. Makes a throwaway CA (``brokerd.throwaway_ca``) in a
temporary directory and starts, on free loopback ports:

- one brokerd with a plain port and a TLS port (``[tls]``, ``verify = "none"``);
- unless ``--no-rabbitmq``, one RabbitMQ node (Debian's rabbitmq-server) with
  the same certificate on an ``ssl_options`` listener beside its plain one;
- two brokerd clusters of three primaries, one with plain links and one with
  links over mutual TLS (cluster file ``[tls] links = "required"``).

Then runs, brokers alternating run by run, ``queue-250`` and ``durable-4k``
of ``python -m brokerd.bench`` against each broker over plain AMQP and over
AMQPS (the bench client wraps its sockets with Python's default client
context, for both brokers alike), and the replicated cluster path (a durable
queue without a type, so replicated to every primary: declared on the root,
published on the second primary, consumed on the third, transient messages,
clients on the plain ports) on both clusters. Prints Markdown tables with
the ratios and stops everything.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from brokerd import throwaway_ca
from brokerd.bench.cluster import GUEST, BrokerdCluster, RabbitCluster, write_report
from brokerd.bench.failover import Node
from brokerd.bench.ports import free_port
from brokerd.bench.scenarios import BenchError, Options, run_scenario

SCENARIOS = ("queue-250", "durable-4k")


def amqps(port: int, cafile: Path) -> str:
    return f"amqps://guest:guest@127.0.0.1:{port}/?cafile={cafile}"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench.tlscost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per set-up (median reported)")
    p.add_argument("--duration", type=float, default=6.0, help="measurement window, seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up, seconds")
    p.add_argument("--no-rabbitmq", action="store_true", help="brokerd only")
    p.add_argument("--no-cluster", action="store_true", help="skip the TLS-links part")
    p.add_argument("--json", metavar="OUT.json", default=None)
    args = p.parse_args(argv)
    opts = Options(duration=args.duration, warmup=args.warmup)
    base = Path(tempfile.mkdtemp(prefix="rookery-bench-tls-"))
    pki, _ = throwaway_ca.ensure(base / "pki")
    certfile, keyfile = pki.server
    config = base / "brokerd.toml"
    config.write_text(f'[tls]\ncertfile = "{certfile}"\nkeyfile = "{keyfile}"\nverify = "none"\n')
    tls_port = free_port()
    single = Node(
        base / "single",
        0,
        free_port(),
        None,
        extra=["--tls-port", str(tls_port), "--config", str(config)],
    )
    rabbit = None if args.no_rabbitmq else RabbitCluster(base / "rabbitmq", size=1, tls=pki)
    clusters: dict[str, BrokerdCluster] = {}
    if not args.no_cluster:
        clusters = {
            "plain links": BrokerdCluster(base / "plain-links"),
            "TLS links": BrokerdCluster(base / "tls-links", tls=pki),
        }
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        single.start()
        if rabbit is not None:
            rabbit.start()
        for cluster in clusters.values():
            cluster.start()
        time.sleep(1.0)
        setups: list[tuple[str, str, str, Options]] = []
        for scenario in SCENARIOS:
            setups += [
                (f"{scenario} brokerd plain", scenario, GUEST.format(port=single.port), opts),
                (f"{scenario} brokerd TLS", scenario, amqps(tls_port, pki.cafile), opts),
            ]
            if rabbit is not None:
                setups += [
                    (
                        f"{scenario} RabbitMQ plain",
                        scenario,
                        GUEST.format(port=rabbit.ports[0]),
                        opts,
                    ),
                    (
                        f"{scenario} RabbitMQ TLS",
                        scenario,
                        amqps(rabbit.tls_ports[0], pki.cafile),
                        opts,
                    ),
                ]
        for name, cluster in clusters.items():
            replicated = Options(
                **{
                    **vars(opts),
                    "durable_queues": True,
                    "publish_url": GUEST.format(port=cluster.ports[1]),
                    "consume_url": GUEST.format(port=cluster.ports[2]),
                }
            )
            setups.append(
                (f"replicated {name}", "queue-250", GUEST.format(port=cluster.ports[0]), replicated)
            )
        for _ in range(args.repeat):
            for label, scenario, url, options in setups:
                print(f"bench: {label} ...", file=sys.stderr, flush=True)
                try:
                    result = run_scenario(url, scenario, options)
                except (BenchError, OSError) as exc:
                    result = {"error": str(exc)}
                print(f"bench:   {result.get('value', result.get('error'))}", file=sys.stderr)
                results.setdefault(label, []).append(result)
    finally:
        single.stop()
        if rabbit is not None:
            rabbit.stop()
        for cluster in clusters.values():
            cluster.stop()
    medians = {
        label: _median([r["value"] for r in runs if "value" in r])
        for label, runs in results.items()
    }
    print(
        "| scenario | brokerd plain | RabbitMQ plain | ratio | brokerd TLS | RabbitMQ TLS "
        "| ratio | brokerd TLS/plain | RabbitMQ TLS/plain |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scenario in SCENARIOS:
        bp, bt = medians.get(f"{scenario} brokerd plain"), medians.get(f"{scenario} brokerd TLS")
        rp = medians.get(f"{scenario} RabbitMQ plain")
        rt = medians.get(f"{scenario} RabbitMQ TLS")
        print(
            f"| {scenario} | {_rate(bp)} | {_rate(rp)} | {_ratio(bp, rp)} | {_rate(bt)} "
            f"| {_rate(rt)} | {_ratio(bt, rt)} | {_ratio(bt, bp)} | {_ratio(rt, rp)} |"
        )
    if clusters:
        plain, tls = medians.get("replicated plain links"), medians.get("replicated TLS links")
        print("\n| replicated queue, 3 primaries | plain links | TLS links | ratio |")
        print("|---|---:|---:|---:|")
        row = f"{_rate(plain)} | {_rate(tls)} | {_ratio(tls, plain)}"
        print(f"| queue-250, durable queue (deliveries/s) | {row} |")
    if args.json:
        write_report(args.json, "python -m brokerd.bench.tlscost", vars(args), results, medians)
    shutil.rmtree(base, ignore_errors=True)
    return 0 if all("value" in r for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
