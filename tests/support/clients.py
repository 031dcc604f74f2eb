"""A pika client as the cluster tests open it: one attempt, bounded waits, so a
server that does not answer fails the test instead of hanging it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions


def connect(port: int, blocked_timeout: float = 10, **kwargs: Any) -> pika.BlockingConnection:
    """A blocking connection to 127.0.0.1:``port``; a connection the broker
    blocks (alarm, quorum lost) gives up after ``blocked_timeout`` seconds."""
    params = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=blocked_timeout,
        **kwargs,
    )
    return pika.BlockingConnection(params)


def drain_queues(conn: pika.BlockingConnection, queues: list[str], timeout: float) -> list[str]:
    """Every body left in ``queues``, got with auto-ack; a queue whose owner is still
    recovering or failing over (the channel closed: 404) is asked again, each queue
    for up to ``timeout`` seconds, until it says it is empty."""
    return [body for body, _redelivered in drain_flagged(conn, queues, timeout)]


def drain_flagged(
    conn: pika.BlockingConnection, queues: list[str], timeout: float
) -> list[tuple[str, bool]]:
    """``drain_queues`` with each body's redelivered flag: a message may come twice
    after a fault (at least once), never twice unflagged."""
    got: list[tuple[str, bool]] = []
    for name in queues:
        ch = conn.channel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                method, _props, body = ch.basic_get(name, auto_ack=True)
            except pika.exceptions.ChannelClosedByBroker:
                ch = conn.channel()
                time.sleep(0.2)
                continue
            if method is None:
                if ch.queue_declare(name, passive=True).method.message_count == 0:
                    break
                continue
            got.append((body.decode(), bool(method.redelivered)))
    return got


def publish_confirmed(
    connect: Callable[[], pika.BlockingConnection],
    queues: list[str],
    prefix: str,
    stop: threading.Event,
    out: set[str],
) -> None:
    """Persistent publishes, each confirmed before the next, round robin over
    ``queues`` until ``stop``; a connection lost to a fault is opened again.
    ``out`` gets the bodies the broker confirmed (an unconfirmed one is neither
    counted nor published again)."""
    n = 0
    while not stop.is_set():
        try:
            conn = connect()
        except pika.exceptions.AMQPConnectionError:
            time.sleep(0.05)
            continue
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            while not stop.is_set():
                body = f"{prefix}-{n}"
                n += 1
                ch.basic_publish(
                    "",
                    queues[n % len(queues)],
                    body.encode(),
                    pika.BasicProperties(delivery_mode=2),
                    mandatory=True,
                )
                out.add(body)
        except (pika.exceptions.AMQPError, OSError):
            time.sleep(0.05)
        finally:
            if conn.is_open:
                with contextlib.suppress(Exception):
                    conn.close()


@contextlib.contextmanager
def confirmed_publishers(
    connects: list[Callable[[], pika.BlockingConnection]], queues: list[str], join: float = 60
) -> Iterator[list[set[str]]]:
    """One ``publish_confirmed`` thread per connection factory (publishers ``p0``,
    ``p1``...), running for the block; yields the sets of bodies each has had
    confirmed, and stops and joins them on the way out."""
    confirmed: list[set[str]] = [set() for _ in connects]
    stop = threading.Event()
    threads = [
        threading.Thread(target=publish_confirmed, args=(c, queues, f"p{i}", stop, out))
        for i, (c, out) in enumerate(zip(connects, confirmed, strict=True))
    ]
    for thread in threads:
        thread.start()
    try:
        yield confirmed
    finally:
        stop.set()
        for thread in threads:
            thread.join(join)
