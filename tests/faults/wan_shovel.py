"""Shovel throughput over a slow link, Rookery's against RabbitMQ's (issue 42).

``python -m tests.faults.wan_shovel --messages 20000 --rtt 0.05 --rate 8000000``

Two standalone brokerd (source and destination) and two RabbitMQ 3.10 nodes
(not clustered), each destination behind a ``SlowLink`` proxy that delays each
direction by half the round trip and caps the bandwidth. A queue of
``--messages`` persistent messages on each source is shovelled, ``on-confirm``,
by the source broker's own shovel (``brokerd ctl bridges set``;
``rabbitmqctl set_parameter shovel``) through the proxy into the destination
queue; the figure is the rate from the moment the link is released (it is stalled
while the source fills, so both shovels are running and hold a window) to the
last message at the destination. Each window (``--prefetch``) is run on both.

With ``on-confirm`` at most a window of messages is unconfirmed, so a shovel
moves at most ``window / RTT`` messages a second, or the bandwidth cap over the
message size, whichever is lower; the report prints both bounds beside the
figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pika

from brokerd.bench.cluster import RabbitCluster
from tests.brokerd_process import BrokerProcess
from tests.support.slowlink import SlowLink


def fill(port: int, queue: str, count: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    body = b"w" * size
    props = pika.BasicProperties(delivery_mode=2)
    for i in range(count):
        ch.basic_publish("", queue, b"%08d" % i + body[8:], props)
    conn.close()


def depth(port: int, queue: str) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        return conn.channel().queue_declare(queue, durable=True).method.message_count
    finally:
        conn.close()


def wait_moved(dest_port: int, queue: str, count: int, timeout: float) -> float:
    """Seconds until ``count`` messages are in the destination queue."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if depth(dest_port, queue) >= count:
            return time.monotonic() - start
        time.sleep(0.02)
    raise TimeoutError(f"{queue}: {depth(dest_port, queue)} of {count} after {timeout}s")


def measure(
    link: SlowLink,
    fill_source: Callable[[], None],
    dest_port: int,
    queue: str,
    args: argparse.Namespace,
) -> float:
    """Messages per second through a shovel that is already running: the link is
    stalled while the source queue fills (the shovel takes its first window into the
    stalled link), then released; the clock runs from the release to the last
    message at the destination. Neither side's command-line start-up counts."""
    link.stall()
    fill_source()
    link.release()
    return args.messages / wait_moved(dest_port, queue, args.messages, args.timeout)


def settle(dest_port: int, queue: str, timeout: float = 30.0) -> None:
    """Wait until the shovel declared its destination queue: it is running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", dest_port))
        try:
            conn.channel().queue_declare(queue, passive=True)
            time.sleep(1.0)
            return
        except pika.exceptions.ChannelClosedByBroker:
            time.sleep(0.2)
        finally:
            if conn.is_open:
                conn.close()
    raise TimeoutError(f"the shovel did not declare {queue}")


def definition(src: str, queue: str, dest: str, prefetch: int) -> dict[str, object]:
    return {
        "src-uri": src,
        "src-queue": queue,
        "dest-uri": dest,
        "dest-queue": f"{queue}-moved",
        "src-prefetch-count": prefetch,
        "ack-mode": "on-confirm",
        "src-delete-after": "never",
    }


def run_rookery(base: Path, args: argparse.Namespace, prefetch: int) -> float:
    source = BrokerProcess(base / f"src-{prefetch}").start()
    dest = BrokerProcess(base / f"dest-{prefetch}").start()
    link = SlowLink(("127.0.0.1", 0), ("127.0.0.1", dest.port)).start()
    link.set(delay=args.rtt / 2, rate=args.rate)
    try:
        queue = f"wan-{prefetch}"
        depth(source.port, queue)  # declared, empty
        proxied = f"amqp://guest:guest@127.0.0.1:{link.address[1]}"
        doc = definition("amqp://", queue, proxied, prefetch)
        ctl = [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(source.data_dir)]
        out = subprocess.run(
            [*ctl, "bridges", "set", "wan", json.dumps(doc)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        settle(dest.port, f"{queue}-moved")
        return measure(
            link,
            lambda: fill(source.port, queue, args.messages, args.size),
            dest.port,
            f"{queue}-moved",
            args,
        )
    finally:
        link.close()
        source.stop()
        dest.stop()


def run_rabbitmq(base: Path, args: argparse.Namespace, prefetch: int) -> float:
    source = RabbitCluster(
        base / f"rsrc-{prefetch}", 1, plugins=("rabbitmq_shovel",), name="wansrc"
    )
    dest = RabbitCluster(base / f"rdest-{prefetch}", 1, name="wandest")
    source.start()
    dest.start()
    link = SlowLink(("127.0.0.1", 0), ("127.0.0.1", dest.ports[0])).start()
    link.set(delay=args.rtt / 2, rate=args.rate)
    try:
        queue = f"wan-{prefetch}"
        depth(source.ports[0], queue)
        proxied = f"amqp://guest:guest@127.0.0.1:{link.address[1]}"
        doc = definition("amqp://", queue, proxied, prefetch)
        source.ctl(0, "set_parameter", "shovel", "wan", json.dumps(doc))
        settle(dest.ports[0], f"{queue}-moved")
        return measure(
            link,
            lambda: fill(source.ports[0], queue, args.messages, args.size),
            dest.ports[0],
            f"{queue}-moved",
            args,
        )
    finally:
        link.close()
        source.stop()
        dest.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1024, help="message body bytes")
    parser.add_argument("--rtt", type=float, default=0.05, help="round trip, seconds")
    parser.add_argument("--rate", type=float, default=8_000_000, help="bytes/s each way")
    parser.add_argument("--prefetch", default="100,1000", help="windows, comma-separated")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-rabbitmq", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="wan-shovel-") as tmp:
        base = Path(tmp)
        for prefetch in (int(p) for p in args.prefetch.split(",")):
            ours = run_rookery(base, args, prefetch)
            theirs = None if args.no_rabbitmq else run_rabbitmq(base, args, prefetch)
            window_bound = prefetch / args.rtt
            wire_bound = args.rate / (args.size + 120)  # frames and properties per message
            rows.append(
                {
                    "prefetch": prefetch,
                    "rookery_per_s": round(ours),
                    "rabbitmq_per_s": None if theirs is None else round(theirs),
                    "ratio": None if theirs is None else round(ours / theirs, 2),
                    "window_bound_per_s": round(window_bound),
                    "bandwidth_bound_per_s": round(wire_bound),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows})
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
