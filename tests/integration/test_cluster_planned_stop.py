"""A planned stop moves the stopping owner's queues first (issue 23, seed 001's
moving queue ownership).

Real brokerd processes (three primaries), pika, SIGTERM. The owner of a
replicated queue is stopped cleanly while a publisher on another server keeps
publishing: before it exits, its queue moves to another primary, with no
failover (nothing redelivered, no fence), and every confirmed message drains
byte for byte, in order.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingConnection

from tests.cluster_harness import Cluster
from tests.conftest import uid
from tests.support.eventually import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


def connect(cluster: Cluster, index: int) -> BlockingConnection:
    return BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.ports[index]))


def test_a_stopping_owner_moves_its_queues_instead_of_failing_them_over(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, primaries=3, interval=0.5, timeout=2.5)
    try:
        root = cluster.start_settled()
        a, b = cluster.followers(root)
        names = [uid("stop-move") for _ in range(3)]
        with connect(cluster, a) as conn:  # declared on a: a owns them
            ch = conn.channel()
            for name in names:
                ch.queue_declare(name, durable=True)
        assert sorted(cluster.ctl(a, "status")["owned_queues"]) == sorted(names)
        bodies = {name: [] for name in names}  # type: dict[str, list[bytes]]
        stop = threading.Event()
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                with connect(cluster, b) as conn:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    n = 0
                    while not stop.is_set() or n < 300:
                        name = names[n % len(names)]
                        body = b"%06d:" % n + bytes([n % 251]) * (n % 700)
                        ch.basic_publish(
                            "", name, body, pika.BasicProperties(delivery_mode=2), mandatory=True
                        )
                        bodies[name].append(body)  # confirmed: basic_publish returned
                        n += 1
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        publisher = threading.Thread(target=publish)
        publisher.start()
        try:
            eventually(lambda: sum(map(len, bodies.values())) > 100, 10, "publishes")
            assert cluster.stop(a) == 0
        finally:
            stop.set()
            publisher.join(30)
        assert not errors, errors
        log = cluster.nodes[a].process.log_text()  # type: ignore[union-attr]
        assert f"stopping: {len(names)} of {len(names)} queues moved" in log, log[-3000:]
        eventually(
            lambda: (
                sorted(q for i in (root, b) for q in cluster.ctl(i, "status")["owned_queues"])
                == sorted(names)
            ),
            10,
            "the queues owned by the servers left",
        )
        for i in (root, b):  # moved, not failed over: nobody fenced a
            text = cluster.nodes[i].process.log_text()  # type: ignore[union-attr]
            assert not any(f"queue={n} fails over" in text for n in names), text[-3000:]
        with connect(cluster, root) as conn:
            ch = conn.channel()
            for name in names:
                got = []
                while True:
                    method, _props, body = ch.basic_get(name, auto_ack=True)
                    if method is None:
                        break
                    assert not method.redelivered, (name, body[:8])
                    got.append(body)
                assert got == bodies[name], (name, len(got), len(bodies[name]))
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.close()
