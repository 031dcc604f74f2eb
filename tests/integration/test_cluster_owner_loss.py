"""A classic queue's owner dies: RabbitMQ's classic-queue semantics (issue 23).

Real brokerd processes (three primaries), pika, kill -9. When the owner of a
classic shared queue dies, a transient queue goes with it (its consumers
elsewhere are cancelled), a durable one stays declared but unavailable
(consume answers 404 "home node ... is down or inaccessible", publishes are
nacked) until its owner restarts, and then holds every confirmed message,
byte for byte. Queues owned elsewhere see no outage.
"""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import ChannelClosedByBroker, NackError

from tests.cluster_harness import Cluster
from tests.conftest import uid
from tests.support.eventually import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.timeout(120),
]

CLASSIC = {"x-queue-type": "classic"}


def connect(cluster: Cluster, index: int) -> BlockingConnection:
    return BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.ports[index]))


def owned(cluster: Cluster, index: int) -> list[str]:
    return list(cluster.ctl(index, "status")["owned_queues"])


def test_a_dead_owner_takes_its_transient_queue_and_keeps_its_durable_one_for_its_return(
    tmp_path: Any,
) -> None:
    cluster = Cluster(tmp_path, primaries=3, interval=0.5, timeout=2.5)
    try:
        root = cluster.start_settled()
        a, b = cluster.followers(root)
        transient, durable, elsewhere = uid("gone"), uid("kept"), uid("on-b")
        bodies = [b"%04d:" % i + bytes([i % 256]) * 3000 for i in range(300)]
        with connect(cluster, a) as conn:
            ch = conn.channel()
            ch.queue_declare(transient, arguments=CLASSIC)
            ch.queue_declare(durable, durable=True, arguments=CLASSIC)
            ch.confirm_delivery()
            for body in bodies:
                ch.basic_publish("", durable, body, pika.BasicProperties(delivery_mode=2))
        with connect(cluster, b) as conn:
            conn.channel().queue_declare(elsewhere, arguments=CLASSIC)
        eventually(lambda: {transient, durable} <= set(owned(cluster, a)), 10, "owned by a")

        watcher = connect(cluster, b)
        wch = watcher.channel()
        cancelled: list[str] = []
        wch.basic_consume(transient, lambda *args: None)
        wch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))

        killed = cluster.kill(a)
        # the transient queue goes with its owner, and its consumer hears so
        deadline = time.monotonic() + 15
        while not cancelled and time.monotonic() < deadline:
            watcher.process_data_events(time_limit=0.1)
        assert cancelled, "the consumer of the dead owner's transient queue was not cancelled"
        assert time.monotonic() - killed < 15
        watcher.close()

        with connect(cluster, root) as conn:
            with pytest.raises(ChannelClosedByBroker) as gone:
                conn.channel().queue_declare(transient, passive=True)
            assert gone.value.reply_code == 404
        # the durable one is still declared, but unavailable: consume 404, publish nacked
        with connect(cluster, b) as conn:

            def refused() -> bool:
                probe = conn.channel()
                try:
                    probe.basic_consume(durable, lambda *args: None)
                except ChannelClosedByBroker as exc:
                    assert exc.reply_code == 404 and "home node" in exc.reply_text
                    return True
                probe.close()
                return False

            eventually(refused, 15, "consume refused while the owner is away")
            with pytest.raises(ChannelClosedByBroker) as absent:  # as RabbitMQ answers
                conn.channel().queue_declare(durable, durable=True, passive=True)
            assert absent.value.reply_code == 404 and "down or inaccessible" in str(absent.value)
            ch = conn.channel()
            ch.confirm_delivery()
            with pytest.raises(NackError):
                ch.basic_publish("", durable, b"nobody-takes-this")
        # a queue owned elsewhere sees no outage
        with connect(cluster, b) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", elsewhere, b"still-here")
            assert ch.basic_get(elsewhere, auto_ack=True)[2] == b"still-here"

        # the owner restarts (a new spid, same address and disk): the queue is its again
        cluster.start(a)
        eventually(lambda: durable in owned(cluster, a), 20, "durable queue owned by a again")
        with connect(cluster, b) as conn:
            ch = conn.channel()
            got: list[bytes] = []
            deadline = time.monotonic() + 15
            while len(got) < len(bodies) and time.monotonic() < deadline:
                method, _props, body = ch.basic_get(durable, auto_ack=True)
                if method is None:
                    time.sleep(0.05)
                    continue
                got.append(body)
            assert got == bodies
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.close()
