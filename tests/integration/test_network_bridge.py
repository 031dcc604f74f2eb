"""A partial partition on a real network (tests/support/netbed.py; issue 41): one
pair of servers cut both ways, the root hearing both (the "bridge" topology).

Nobody fails the queue's owner over, since the root hears it; a server whose
client publishes to that owner cannot reach it. It sends its clients elsewhere
(320, naming the owner and the witness, ``cluster/detachment.py``), as RabbitMQ
promotes a partial partition to a full one, and a client with the other
servers' addresses resumes there in about a second instead of waiting out the
cut. Nothing confirmed is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pika.exceptions import AMQPError

from tests.cluster_harness import Cluster, netbed_cluster
from tests.faults.workload import close_quietly, connect, declare
from tests.support.netbed import unavailable

# serial: the resume is measured against the heartbeat, beside no other load (Makefile)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.skipif(unavailable() is not None, reason=f"netbed: {unavailable()}"),
]

TIMEOUT = 1.0
QUEUE = "bridged"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with netbed_cluster(tmp_path, 3, TIMEOUT) as made:
        yield made


class Publisher(threading.Thread):
    """Confirmed publishes from server ``first``, then the others in turn."""

    def __init__(self, cluster: Cluster, first: int) -> None:
        super().__init__(daemon=True)
        self.endpoints = cluster.endpoints
        self.at = first
        self.stop = threading.Event()
        self.confirmed: list[tuple[int, float, int]] = []  # (seq, when, server)
        self.closes: list[str] = []

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            try:
                conn = connect(self.endpoints[self.at])
            except (AMQPError, OSError):
                self.at = (self.at + 1) % len(self.endpoints)
                time.sleep(0.05)
                continue
            try:
                channel = conn.channel()
                channel.confirm_delivery()
                while not self.stop.is_set():
                    seq += 1
                    channel.basic_publish(
                        "", QUEUE, str(seq).encode(), pika.BasicProperties(delivery_mode=2)
                    )
                    self.confirmed.append((seq, time.monotonic(), self.at))
                    time.sleep(0.01)
            except (AMQPError, OSError) as exc:
                self.closes.append(f"{type(exc).__name__}: {exc}")
                self.at = (self.at + 1) % len(self.endpoints)
            finally:
                close_quietly(conn)


def test_a_server_cut_from_its_clients_queue_owner_sends_them_to_a_server_that_reaches_it(
    cluster: Cluster,
) -> None:
    bed = cluster.netbed
    assert bed is not None and cluster.settled_root() == cluster.spid(0)
    owner, cut_off = 1, 2
    declare([cluster.endpoints[owner]], [QUEUE])  # declared through its owner: owned there
    publisher = Publisher(cluster, cut_off)
    publisher.start()
    try:
        cluster.wait_until(lambda: len(publisher.confirmed) > 20, timeout=10, what="confirms")
        bed.cut_both(cluster.nodes[owner].bed_slot, cluster.nodes[cut_off].bed_slot)  # type: ignore[arg-type]
        cut_at = time.monotonic()
        cluster.wait_until(
            lambda: any(s != cut_off and t > cut_at for _, t, s in publisher.confirmed),
            timeout=6 * TIMEOUT,
            what="confirms again, through another server",
        )
        resumed = time.monotonic() - cut_at
        time.sleep(1.0)
    finally:
        bed.heal()
        publisher.stop.set()
        publisher.join(10)
    assert publisher.closes, "the cut-off server never sent the publisher away"
    assert "320" in publisher.closes[0] and f"owner of queue '{QUEUE}'" in publisher.closes[0]
    assert "reached by" in publisher.closes[0], publisher.closes[0]
    # silent two intervals, half an interval's grace, a reconnect: well before the cut ends
    assert resumed < 3 * TIMEOUT, resumed
    log = cluster.nodes[cut_off].process.log_text()  # type: ignore[union-attr]
    assert "cut from an owner" in log
    owner_log = cluster.nodes[owner].process.log_text()  # type: ignore[union-attr]
    assert "cut from an owner" not in owner_log  # its clients need nothing across the cut
    # nothing confirmed is lost: the queue holds every confirmed message
    cluster.wait_until(cluster.settled_root, timeout=20, what="one root after the heal")
    wanted = {seq for seq, _, _ in publisher.confirmed}
    got: set[int] = set()
    conn = connect(cluster.endpoints[0])
    try:
        channel = conn.channel()
        deadline = time.monotonic() + 20
        while not wanted <= got and time.monotonic() < deadline:
            method, _props, body = channel.basic_get(QUEUE, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            got.add(int(body))
    finally:
        close_quietly(conn)
    assert wanted <= got, f"lost {sorted(wanted - got)[:10]}"
