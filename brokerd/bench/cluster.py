"""Cluster throughput: publish on one server, consume on another, queue mastered on a third.

    python -m brokerd.bench.cluster --repeat 3 --duration 6 --json cluster.json

Starts, on free loopback ports and in temporary directories:

- one standalone brokerd (the single-server reference);
- a brokerd cluster of three primaries (the senior one becomes root; the
  queue is declared there, so it owns it: client-local);
- unless ``--no-rabbitmq``, three RabbitMQ nodes (Debian's rabbitmq-server),
  each with its own ``RABBITMQ_NODENAME=rkbN@localhost``, node and
  distribution ports, mnesia and log directories, joined into one cluster
  with ``rabbitmqctl join_cluster``.

Then runs the queue scenario of ``python -m brokerd.bench`` (one queue, a
no-ack consumer, confirmed publishes, same pacing) in four set-ups, brokers
alternating run by run: brokerd single server; brokerd cluster with the queue
declared on the root, the publisher on the second primary and the consumer on
the third; RabbitMQ the same way (a classic queue declared on node 1, or a
quorum queue with ``--queue-type quorum``); and RabbitMQ node 1 alone in its
cluster. Prints a Markdown table with the ratios and stops everything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from brokerd.bench.failover import Node
from brokerd.bench.ports import free_port
from brokerd.bench.scenarios import BenchError, Options, run_scenario
from brokerd.throwaway_ca import ThrowawayPki

GUEST = "amqp://guest:guest@127.0.0.1:{port}/"


class BrokerdCluster:
    """Three brokerd primaries (index 0 is the most senior, so the root); with
    ``tls``, links over mutual TLS (the known hosts are the AMQPS ports; clients
    still use the plain ``ports``)."""

    def __init__(self, base: Path, size: int = 3, tls: ThrowawayPki | None = None) -> None:
        self.ports = [free_port() for _ in range(size)]
        self.tls_ports = [free_port() for _ in range(size)] if tls is not None else []
        hosts = ", ".join(f'"127.0.0.1:{p}"' for p in (self.tls_ports or self.ports))
        base.mkdir(parents=True, exist_ok=True)
        self.file = base / "cluster.toml"
        table = ""
        if tls is not None:
            certfile, keyfile = tls.server
            table = (
                f'[tls]\nlinks = "required"\ncafile = "{tls.cafile}"\n'
                f'certfile = "{certfile}"\nkeyfile = "{keyfile}"\n'
            )
        self.file.write_text(
            f'name = "bench"\nsecret = "bench-secret-1"\nknown_hosts = [{hosts}]\n{table}'
        )
        self.nodes = [
            Node(
                base,
                i,
                port,
                self.file,
                "primary",
                ["--tls-port", str(self.tls_ports[i])] if tls is not None else None,
            )
            for i, port in enumerate(self.ports)
        ]

    def start(self, timeout: float = 30.0) -> str:
        for node in self.nodes:
            node.start()
            time.sleep(0.3)  # seniority follows the start order
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            views = [node.status() for node in self.nodes]
            roots = {v.get("root") for v in views if v}
            if len(roots) == 1 and all(v and v.get("ready") for v in views):
                root = roots.pop()
                assert root is not None
                return root
            time.sleep(0.2)
        raise BenchError("the brokerd cluster elected no root in time")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


#: Debian's scripts without the wrapper that switches to the rabbitmq user (whose
#: home holds another Erlang cookie and who cannot write our temporary directories)
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


class RabbitCluster:
    """Three rabbitmq-server nodes on their own ports, joined into one cluster."""

    def __init__(
        self,
        base: Path,
        size: int = 3,
        tls: ThrowawayPki | None = None,
        plugins: tuple[str, ...] = (),
        name: str = "rkb",
    ) -> None:
        self.base = base
        #: plugins to enable on every node (``rabbitmq_shovel``, ``rabbitmq_federation``)
        self.plugins = plugins
        base.mkdir(parents=True, exist_ok=True)
        cookie = base / ".erlang.cookie"  # HOME for the nodes and rabbitmqctl alike
        cookie.write_text(os.urandom(16).hex())
        cookie.chmod(0o400)
        #: node names are machine-wide (epmd): concurrent users pass their own ``name``
        self.nodes = [f"{name}{i + 1}@localhost" for i in range(size)]
        self.ports = [free_port() for _ in range(size)]
        self.dist_ports = [free_port() for _ in range(size)]
        #: with ``tls``: an AMQPS listener beside the plain one (``ssl_options``,
        #: no client certificate asked, as brokerd's ``verify = "none"``)
        self.tls = tls
        self.tls_ports = [free_port() for _ in range(size)] if tls is not None else []

    def _env(self, i: int) -> dict[str, str]:
        home = self.base / f"rk{i + 1}"
        return dict(
            os.environ,
            HOME=str(self.base),
            RABBITMQ_NODENAME=self.nodes[i],
            RABBITMQ_NODE_PORT=str(self.ports[i]),
            RABBITMQ_DIST_PORT=str(self.dist_ports[i]),
            RABBITMQ_MNESIA_BASE=str(home / "mnesia"),
            RABBITMQ_LOG_BASE=str(home / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(home / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(home / "rabbitmq.conf"),
        )

    def _config(self, i: int) -> str:
        if self.tls is None:
            return ""
        certfile, keyfile = self.tls.server
        return (
            f"listeners.ssl.default = {self.tls_ports[i]}\n"
            f"ssl_options.cacertfile = {self.tls.cafile}\n"
            f"ssl_options.certfile = {certfile}\n"
            f"ssl_options.keyfile = {keyfile}\n"
            "ssl_options.verify = verify_none\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
        )

    def ctl(self, i: int, *args: str, timeout: float = 120.0) -> str:
        """``rabbitmqctl`` against node ``i``; its output."""
        return self._ctl(i, *args, timeout=timeout)

    def _ctl(self, i: int, *args: str, timeout: float = 120.0) -> str:
        return subprocess.run(
            [str(self._bin("rabbitmqctl")), "-n", self.nodes[i], *args],
            env=self._env(i),
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
        ).stdout

    @staticmethod
    def _bin(name: str) -> Path:
        path = RABBITMQ_BIN / name
        return path if path.exists() else Path(shutil.which(name) or name)

    def start(self) -> None:
        if not self._bin("rabbitmq-server").exists():
            raise BenchError("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        for i in range(len(self.nodes)):
            home = self.base / f"rk{i + 1}"
            home.mkdir(parents=True, exist_ok=True)
            (home / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
            (home / "rabbitmq.conf").write_text(self._config(i))
            subprocess.run(
                [str(self._bin("rabbitmq-server")), "-detached"],
                env=self._env(i),
                check=True,
                timeout=60,
            )
        for i in range(len(self.nodes)):
            # a detached node registers with epmd a moment after the command returns:
            # until then rabbitmqctl cannot reach it at all (exit 69) and does not wait
            deadline = time.monotonic() + 120
            while True:
                try:
                    self._ctl(i, "await_startup")
                    break
                except subprocess.CalledProcessError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1.0)
        for i in range(1, len(self.nodes)):
            self._ctl(i, "stop_app")
            self._ctl(i, "join_cluster", self.nodes[0])
            self._ctl(i, "start_app")

    def stop(self) -> None:
        for i in reversed(range(len(self.nodes))):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._ctl(i, "stop", timeout=60)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per set-up (median reported)")
    p.add_argument("--duration", type=float, default=6.0, help="measurement window, seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up, seconds")
    p.add_argument("--body-size", type=int, default=250, help="message body size in bytes")
    p.add_argument("--confirm-window", type=int, default=8000, help="unconfirmed in flight")
    p.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        default="classic",
        help="RabbitMQ queue type in the cluster set-up (default classic)",
    )
    p.add_argument(
        "--persistent",
        action="store_true",
        help="durable queue, persistent messages (brokerd: journalled on its owner and on "
        "every replica; compare with --queue-type quorum)",
    )
    p.add_argument("--no-rabbitmq", action="store_true", help="brokerd only")
    p.add_argument("--json", metavar="OUT.json", default=None)
    args = p.parse_args(argv)
    opts = Options(
        duration=args.duration,
        warmup=args.warmup,
        body_size=args.body_size,
        confirm_window=args.confirm_window,
        persistent=args.persistent,
    )
    base = Path(tempfile.mkdtemp(prefix="rookery-bench-cluster-"))
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
        setups: list[tuple[str, Options, str]] = [
            ("brokerd single server", opts, GUEST.format(port=single.port)),
            (
                "brokerd cluster: root declares, B publishes, C consumes",
                Options(
                    **{
                        **vars(opts),
                        "publish_url": GUEST.format(port=brokerd.ports[1]),
                        "consume_url": GUEST.format(port=brokerd.ports[2]),
                    }
                ),
                GUEST.format(port=brokerd.ports[0]),
            ),
        ]
        if rabbit is not None:
            qargs = {"x-queue-type": args.queue_type} if args.queue_type == "quorum" else None
            setups += [
                (
                    f"RabbitMQ cluster ({args.queue_type}): node 1 declares, 2 publishes, "
                    "3 consumes",
                    Options(
                        **{
                            **vars(opts),
                            "publish_url": GUEST.format(port=rabbit.ports[1]),
                            "consume_url": GUEST.format(port=rabbit.ports[2]),
                            "queue_arguments": qargs,
                        }
                    ),
                    GUEST.format(port=rabbit.ports[0]),
                ),
                (
                    f"RabbitMQ node 1 alone ({args.queue_type})",
                    Options(**{**vars(opts), "queue_arguments": qargs}),
                    GUEST.format(port=rabbit.ports[0]),
                ),
            ]
        for _ in range(args.repeat):
            for label, options, url in setups:
                print(f"bench: {label} ...", file=sys.stderr, flush=True)
                try:
                    result = run_scenario(url, "queue-250", options)
                except (BenchError, OSError) as exc:
                    result = {"error": str(exc)}
                print(f"bench:   {result.get('value', result.get('error'))}", file=sys.stderr)
                results.setdefault(label, []).append(result)
    finally:
        single.stop()
        brokerd.stop()
        if rabbit is not None:
            rabbit.stop()
    rows = []
    medians: dict[str, float | None] = {}
    for label, runs in results.items():
        ok = [r for r in runs if "value" in r]
        medians[label] = _median([r["value"] for r in ok])
        rows.append((label, medians[label], _median([r["publish_rate"] for r in ok]), len(ok)))
    print("| set-up | deliveries/s | publish/s (confirmed) | runs |")
    print("|---|---:|---:|---:|")
    for label, value, publish, n in rows:
        shown = "-" if value is None else f"{value:,.0f}"
        pub = "-" if publish is None else f"{publish:,.0f}"
        print(f"| {label} | {shown} | {pub} | {n} |")
    labels = list(medians)
    if rabbit is not None and len(labels) >= 3 and medians[labels[1]] and medians[labels[2]]:
        print(
            f"\nbrokerd cluster / RabbitMQ cluster: {medians[labels[1]] / medians[labels[2]]:.2f}"
        )
    if medians.get(labels[0]) and medians.get(labels[1]):
        print(f"brokerd cluster / brokerd single: {medians[labels[1]] / medians[labels[0]]:.2f}")
    if args.json:
        write_report(args.json, "python -m brokerd.bench.cluster", vars(args), results, medians)
    shutil.rmtree(base, ignore_errors=True)
    return 0 if all("value" in r for runs in results.values() for r in runs) else 1


def write_report(
    path: str,
    tool: str,
    options: dict[str, Any],
    results: dict[str, list[dict[str, Any]]],
    medians: dict[str, float | None],
    extra: dict[str, Any] | None = None,
) -> None:
    """A cluster benchmark's runs and medians as JSON (``--json``).

    ``extra`` adds top-level keys, such as which variant of the benchmark ran.
    """
    doc = {
        "tool": tool,
        "host": {"node": platform.node(), "python": platform.python_version()},
        "options": options,
        **(extra or {}),
        "results": results,
        "medians": medians,
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
