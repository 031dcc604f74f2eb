"""Failover time: kill -9 the root, time until every other server agrees on a new one.

    python -m brokerd.bench.failover --runs 10 --interval 0.3 --timeout 1.0

Starts three primaries and one secondary on free loopback ports (real
brokerd processes), waits for a root, kills it with SIGKILL, polls every
survivor's control socket until all report the same new root and ready,
restarts the killed server, waits for the cluster to settle, and repeats.
Before each kill it waits a settle window (default: timeout + 2 intervals,
so the restarted server is an ordinary voting member again) plus a random
fraction of an interval, so kills land at every phase of the heartbeat.
Prints the median and maximum, and saves the raw figures with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from brokerd.server.control import request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One brokerd process (standalone when ``cluster`` is None)."""

    def __init__(
        self, base: Path, index: int, port: int, cluster: Path | None, kind: str = "primary"
    ) -> None:
        self.data_dir = base / f"n{index}"
        self.port = port
        clustered = ["--cluster", str(cluster), "--type", kind] if cluster is not None else []
        self.cmd = [
            sys.executable,
            "-m",
            "brokerd",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(self.data_dir),
            *clustered,
            "--log-level",
            "warning",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "brokerd.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def status(self) -> dict[str, Any] | None:
        try:
            reply = request(self.data_dir, "status", timeout=0.5)
        except (OSError, ValueError):
            return None
        return reply.get("result") if reply.get("ok") else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def agreed(nodes: list[Node], exclude: str | None = None) -> str | None:
    views = [n.status() for n in nodes]
    if any(v is None or not v["ready"] for v in views):
        return None
    roots = {v["root"] for v in views if v is not None}
    if len(roots) == 1 and (root := roots.pop()) and root != exclude:
        return root
    return None


def wait_for(predicate: Any, timeout: float, poll: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="rookery-failover-"))
    ports = [free_port() for _ in range(4)]
    cluster = base / "cluster.toml"
    hosts = ", ".join(f'"127.0.0.1:{p}"' for p in ports[:3])
    cluster.write_text(
        f'name = "failover-bench"\nsecret = "failover-bench-secret"\nknown_hosts = [{hosts}]\n'
        f"[heartbeat]\ninterval = {args.interval}\ntimeout = {args.timeout}\n"
    )
    nodes = [
        Node(base, i, p, cluster, "primary" if i < 3 else "secondary") for i, p in enumerate(ports)
    ]
    times: list[float] = []
    settle = args.settle if args.settle is not None else args.timeout + 2 * args.interval
    rng = random.Random(args.seed)
    try:
        for node in nodes:
            node.start()
            time.sleep(0.2)
        if not wait_for(lambda: agreed(nodes), 30, 0.1):
            raise SystemExit("failover bench: the cluster did not form")
        for run_no in range(1, args.runs + 1):
            time.sleep(settle + rng.random() * args.interval)
            root = agreed(nodes)
            if not root:
                raise SystemExit(f"failover bench: no agreed root before run {run_no}")
            victim = next(n for n in nodes if (s := n.status()) and s["spid"] == root)
            survivors = [n for n in nodes if n is not victim]
            assert victim.proc is not None
            os.kill(victim.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            new_root = wait_for(
                lambda survivors=survivors, root=root: agreed(survivors, exclude=root),
                30,
                args.poll,
            )
            elapsed = time.monotonic() - killed
            if not new_root:
                raise SystemExit(f"failover bench: no new root after run {run_no}")
            times.append(elapsed)
            print(
                f"run {run_no}: {elapsed * 1000:.0f} ms (root {root} -> {new_root})",
                file=sys.stderr,
            )
            victim.proc.wait(5)
            victim.start()
            if not wait_for(lambda: agreed(nodes), 30, 0.1):
                raise SystemExit("failover bench: the cluster did not settle after a restart")
    finally:
        for node in nodes:
            node.stop()
    return {
        "heartbeat_interval": args.interval,
        "heartbeat_timeout": args.timeout,
        "settle": settle,
        "runs": len(times),
        "seconds": times,
        "median": statistics.median(times),
        "max": max(times),
        "min": min(times),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m brokerd.bench.failover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=10, help="kills to measure (default 10)")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="heartbeat interval in seconds (default 1.0)"
    )
    parser.add_argument(
        "--timeout", type=float, default=3.0, help="heartbeat timeout in seconds (default 3.0)"
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=0.02,
        help="status polling period while waiting (default 0.02 s)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        help="seconds to let the cluster settle before each kill (default timeout + 2 x interval)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill phase (default 1)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args(argv)
    result = run(args)
    print(
        f"failover over {result['runs']} runs (heartbeat {args.interval}s/{args.timeout}s): "
        f"median {result['median'] * 1000:.0f} ms, max {result['max'] * 1000:.0f} ms, "
        f"min {result['min'] * 1000:.0f} ms"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
