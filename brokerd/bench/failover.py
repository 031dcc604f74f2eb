"""Failover time: kill -9 the root, time until clients publish with confirms again.

    python -m brokerd.bench.failover                      # 20 kills, heartbeat 1 s / 3 s
    python -m brokerd.bench.failover --runs 5 --interval 0.3 --timeout 1.0

Starts three primaries on free loopback ports (real brokerd processes),
declares a durable shared queue (replicated: it fails over with the root),
and repeats: wait until the cluster has settled (every primary votes for
one ready root, then a settle window of timeout + 2 intervals, plus a
random fraction of an interval so kills land at every phase of the
heartbeat), SIGKILL the root, and on each survivor a client
(connected before the kill, publisher confirms on) publishes one message
and waits for its ack; a nack, a return, a closed connection or a refused
one count as "not yet" and it tries again on a new connection. A run's time
is from the kill until both survivors' clients hold an ack; the time until
the survivors agree on the new root (control socket) is reported too. The
killed server is restarted before the next run.

Prints each run on stderr, then the median and maximum. Every process it
started is stopped on the way out, however it ends (a finally block, atexit
and SIGTERM/SIGHUP handlers that kill what is left). ``Node`` is shared
with the other cluster benchmarks; ports come from ``brokerd.bench.ports``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pamqp import commands

from brokerd.bench import frames
from brokerd.bench.client import Client, ServerClosed
from brokerd.bench.frames import AMQPURL, FrameError
from brokerd.bench.ports import free_port
from brokerd.server.control import request

QUEUE = "failover-bench"
GUEST = "amqp://guest:guest@127.0.0.1:{port}/"

#: every brokerd this module started and has not seen end (killed at exit)
_children: set[subprocess.Popen[bytes]] = set()


def _kill_children() -> None:
    """atexit: SIGKILL whatever is left, so no broker outlives the benchmark."""
    for proc in list(_children):
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        _children.discard(proc)


atexit.register(_kill_children)


class Node:
    """One brokerd process (standalone when ``cluster`` is None)."""

    def __init__(
        self,
        base: Path,
        index: int,
        port: int,
        cluster: Path | None,
        kind: str = "primary",
        extra: list[str] | None = None,
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
            *(extra or []),
            "--log-level",
            "warning",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return GUEST.format(port=self.port)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "brokerd.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        _children.add(self.proc)
        log.close()

    def status(self) -> dict[str, Any] | None:
        try:
            reply = request(self.data_dir, "status", timeout=0.5)
        except (OSError, ValueError):
            return None
        return reply.get("result") if reply.get("ok") else None

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        _children.discard(self.proc)  # type: ignore[arg-type]

    def stop(self) -> None:
        """SIGTERM (a graceful stop), SIGKILL if it has not ended within 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        _children.discard(self.proc)  # type: ignore[arg-type]


def agreed(nodes: list[Node], exclude: str | None = None) -> str | None:
    views = [n.status() for n in nodes]
    if any(v is None or not v["ready"] for v in views):
        return None
    roots = {v["root"] for v in views if v is not None}
    if len(roots) == 1 and (root := roots.pop()) and root != exclude:
        return root
    return None


def settled(nodes: list[Node]) -> str | None:
    """The agreed root, once every primary votes for it and sees a quorum (a restarted
    server abstains for one timeout: until then the root rests on fewer votes)."""
    views = [n.status() for n in nodes]
    if any(v is None or not v["ready"] for v in views):
        return None
    roots = {v["root"] for v in views if v is not None}
    root = roots.pop() if len(roots) == 1 else None
    if root and all(v is not None and v["vote"] == root and v["quorum"] for v in views):
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


class Publisher:
    """A client of one server that publishes with confirms, reconnecting as needed."""

    def __init__(self, node: Node) -> None:
        self.url = AMQPURL(node.url)
        self.client: Client | None = None
        self.channel = 0

    def connect(self) -> None:
        self.close()
        client = Client(self.url, timeout=10.0, name="bench-failover").connect()
        self.client = client  # closed by close() even if what follows fails
        self.channel = client.open_channel()
        client.confirm_select(self.channel)

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def drop(self) -> None:
        """Forget a connection that failed: close its socket without a handshake."""
        client, self.client = self.client, None
        if client is not None and client.sock is not None:
            client.sock.close()
            client.sock = None

    def publish(self) -> bool:
        """One mandatory publish; True once acked (routed and taken by the root)."""
        if self.client is None:
            self.connect()
        assert self.client is not None
        method = commands.Basic.Publish(exchange="", routing_key=QUEUE, mandatory=True)
        body = b"failover-bench"
        self.client.send_raw(
            frames.method_frame(self.channel, method)
            + frames.content_frames(self.channel, body, self.client.frame_max)
        )
        reply = self.client.wait(
            self.channel, commands.Basic.Ack, commands.Basic.Nack, commands.Basic.Return
        )
        if isinstance(reply, commands.Basic.Ack):
            return True
        self.close()  # a nack, or a return (followed by its ack): start afresh
        return False

    def until_confirmed(self, started: float, limit: float) -> float:
        """Publish until one is acked; the seconds since ``started`` (raises at ``limit``)."""
        while time.monotonic() - started < limit:
            try:
                if self.publish():
                    return time.monotonic() - started
            except (OSError, ServerClosed, FrameError, TimeoutError):
                self.drop()
            time.sleep(0.01)
        raise TimeoutError(f"no confirmed publish within {limit}s of the kill")


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="rookery-failover-"))
    ports = [free_port() for _ in range(3)]
    cluster = base / "cluster.toml"
    hosts = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
    cluster.write_text(
        f'name = "failover-bench"\nsecret = "failover-bench-secret"\nknown_hosts = [{hosts}]\n'
        f"[heartbeat]\ninterval = {args.interval}\ntimeout = {args.timeout}\n"
    )
    nodes = [Node(base, i, p, cluster) for i, p in enumerate(ports)]
    confirmed: list[float] = []
    elected: list[float] = []
    settle = args.settle if args.settle is not None else args.timeout + 2 * args.interval
    rng = random.Random(args.seed)
    limit = 10 * args.timeout + 10
    try:
        for node in nodes:
            node.start()
            time.sleep(0.2)  # seniority follows the start order
        if not wait_for(lambda: settled(nodes), 3 * args.timeout + 30, 0.1):
            raise SystemExit("failover bench: the cluster did not form")
        probe = Client(AMQPURL(nodes[0].url), name="bench-declare").connect()
        # durable without a type: replicated, so it fails over with the root (a
        # transient one is classic, on the root alone, and goes with it)
        probe.queue_declare(probe.open_channel(), QUEUE, durable=True)
        probe.close()
        for run_no in range(1, args.runs + 1):
            time.sleep(settle + rng.random() * args.interval)
            root = settled(nodes)
            if not root:
                raise SystemExit(f"failover bench: no settled root before run {run_no}")
            victim = next(n for n in nodes if (s := n.status()) and s["spid"] == root)
            survivors = [n for n in nodes if n is not victim]
            publishers = [Publisher(n) for n in survivors]
            for publisher in publishers:
                publisher.connect()
            try:
                with ThreadPoolExecutor(len(publishers)) as pool:
                    victim.kill()
                    killed = time.monotonic()
                    waits = [pool.submit(p.until_confirmed, killed, limit) for p in publishers]
                    new_root = wait_for(
                        lambda survivors=survivors, root=root: agreed(survivors, exclude=root),
                        limit,
                        args.poll,
                    )
                    election = time.monotonic() - killed
                    times = [w.result() for w in waits]
            finally:
                for publisher in publishers:
                    publisher.close()
            if not new_root:
                raise SystemExit(f"failover bench: no new root after run {run_no}")
            confirmed.append(max(times))
            elected.append(election)
            print(
                f"run {run_no}: confirmed again after {max(times) * 1000:.0f} ms "
                f"(per survivor {', '.join(f'{t * 1000:.0f}' for t in times)}), "
                f"root agreed after {election * 1000:.0f} ms ({root} -> {new_root})",
                file=sys.stderr,
            )
            victim.start()
            if not wait_for(lambda: settled(nodes), 3 * args.timeout + 30, 0.1):
                raise SystemExit("failover bench: the cluster did not settle after a restart")
    finally:
        for node in nodes:
            node.stop()
        _kill_children()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return {
        "heartbeat_interval": args.interval,
        "heartbeat_timeout": args.timeout,
        "settle": settle,
        "runs": len(confirmed),
        "confirmed_s": confirmed,
        "elected_s": elected,
        "median": statistics.median(confirmed),
        "max": max(confirmed),
        "min": min(confirmed),
        "elected_median": statistics.median(elected),
        "elected_max": max(elected),
    }


def _exit_on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGHUP end the benchmark through its finally blocks and atexit."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m brokerd.bench.failover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=20, help="kills to measure (default 20)")
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
        help="control-socket polling period for the root agreement (default 0.02 s)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        help="seconds to let the cluster settle before each kill (default timeout + 2 x interval)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill phase (default 1)")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the brokers' data directories and logs"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    result = run(args)
    print(
        f"failover over {result['runs']} kill -9 runs (3 primaries, heartbeat "
        f"{args.interval}s/{args.timeout}s), kill to a confirmed publish on every survivor: "
        f"median {result['median'] * 1000:.0f} ms, max {result['max'] * 1000:.0f} ms "
        f"(min {result['min'] * 1000:.0f} ms; root agreed: median "
        f"{result['elected_median'] * 1000:.0f} ms, max {result['elected_max'] * 1000:.0f} ms)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
