"""Recovery time: a durable queue of N persistent messages, kill -9, restart, time to serve.

    python -m brokerd.bench.recovery --messages 1000000 --body-size 250 --json recovery.json

For brokerd and (unless ``--no-rabbitmq``) a RabbitMQ node, each on free
loopback ports with their own directories: declare a durable queue, publish
N persistent messages with confirms (every one acked), kill the broker with
SIGKILL, start it again, and time from the start command until a client sees
the queue with all N messages (a passive declare answers N). brokerd
rebuilds its queues before it listens; RabbitMQ recovers its queues as it
boots. Both sit on the same disk and the same 2 cores, one after the other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pamqp import commands

from brokerd.bench import frames
from brokerd.bench.client import Client, ServerClosed
from brokerd.bench.cluster import RABBITMQ_BIN, RabbitCluster
from brokerd.bench.failover import Node, free_port
from brokerd.bench.frames import AMQPURL, FrameError

GUEST = "amqp://guest:guest@127.0.0.1:{port}/"
QUEUE = "rookery-recovery"


def fill(url: str, count: int, body_size: int, batch: int = 500, window: int = 20_000) -> float:
    """Publish ``count`` persistent messages with confirms; returns messages/s."""
    client = Client(AMQPURL(url), name="bench-fill").connect()
    channel = client.open_channel()
    client.queue_declare(channel, QUEUE, durable=True)
    client.confirm_select(channel)
    body = frames.make_body(body_size)
    data = frames.publish_batch(channel, "", QUEUE, body, batch, client.frame_max, True)
    started = time.monotonic()
    sent = acked = 0
    while acked < count:
        while sent < count and sent - acked < window:
            client.send_raw(data)
            sent += batch
        reply = client.wait(channel, commands.Basic.Ack, commands.Basic.Nack)
        if isinstance(reply, commands.Basic.Nack):
            raise RuntimeError(f"message {reply.delivery_tag} was nacked")
        acked = max(acked, reply.delivery_tag)
    rate = sent / (time.monotonic() - started)
    client.close()
    return rate


def wait_for_queue(url: str, count: int, timeout: float) -> float:
    """Seconds until a passive declare of the queue answers ``count`` messages."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ServerClosed, FrameError, TimeoutError):
            client = Client(AMQPURL(url), timeout=2.0, name="bench-probe").connect()
            try:
                channel = client.open_channel()
                if client.queue_depth(channel, QUEUE) >= count:
                    return time.monotonic() - started
            finally:
                client.close()
        time.sleep(0.05)
    raise TimeoutError(f"the queue did not come back with {count} messages in {timeout}s")


def measure_brokerd(base: Path, count: int, body_size: int) -> dict[str, Any]:
    node = Node(base, 0, free_port(), None)
    node.start()
    url = GUEST.format(port=node.port)
    wait_for_queue_port(url)
    rate = fill(url, count, body_size)
    assert node.proc is not None
    node.proc.send_signal(signal.SIGKILL)
    node.proc.wait()
    size = sum(f.stat().st_size for f in (base / "n0" / "store").rglob("*") if f.is_file())
    started = time.monotonic()
    node.start()
    seconds = time.monotonic() - started + wait_for_queue(url, count, 600)
    node.stop()
    return {"fill_rate": round(rate), "recovery_s": round(seconds, 2), "store_bytes": size}


def measure_rabbitmq(base: Path, count: int, body_size: int) -> dict[str, Any]:
    node = RabbitCluster(base, size=1)
    node.start()
    url = GUEST.format(port=node.ports[0])
    try:
        rate = fill(url, count, body_size)
        pid = (
            subprocess.run(
                [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.nodes[0], "eval", "os:getpid()."],
                env=node._env(0),
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .strip('"')
        )
        os.kill(int(pid), signal.SIGKILL)
        time.sleep(1.0)
        started = time.monotonic()
        subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmq-server"), "-detached"], env=node._env(0), check=True
        )
        seconds = time.monotonic() - started + wait_for_queue(url, count, 900)
    finally:
        node.stop()
    return {"fill_rate": round(rate), "recovery_s": round(seconds, 2)}


def wait_for_queue_port(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ServerClosed, FrameError):
            Client(AMQPURL(url), timeout=2.0).connect().close()
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing answers at {AMQPURL(url).redacted}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench.recovery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--body-size", type=int, default=250)
    p.add_argument("--no-rabbitmq", action="store_true")
    p.add_argument("--json", metavar="OUT.json", default=None)
    args = p.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="rookery-bench-recovery-"))
    results: dict[str, Any] = {}
    try:
        print("bench: brokerd ...", file=sys.stderr, flush=True)
        results["brokerd"] = measure_brokerd(base / "brokerd", args.messages, args.body_size)
        print(f"bench:   {results['brokerd']}", file=sys.stderr, flush=True)
        if not args.no_rabbitmq:
            print("bench: RabbitMQ ...", file=sys.stderr, flush=True)
            results["rabbitmq"] = measure_rabbitmq(base / "rabbitmq", args.messages, args.body_size)
            print(f"bench:   {results['rabbitmq']}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("| broker | fill (confirmed msg/s) | recovery (s) |")
    print("|---|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['fill_rate']:,} | {r['recovery_s']} |")
    if "rabbitmq" in results:
        b, r = results["brokerd"]["recovery_s"], results["rabbitmq"]["recovery_s"]
        print(f"\nrecovery time RabbitMQ / brokerd: {r / b:.2f} (higher: brokerd faster)")
    if args.json:
        doc = {"host": platform.node(), "options": vars(args), "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
