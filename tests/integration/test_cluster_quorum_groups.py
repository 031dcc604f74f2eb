"""Quorum queues whose ``x-quorum-initial-group-size`` leaves some primaries out, on
real brokerd processes: the copies live on the group alone, a lost owner's queue
fails over within its group with every confirmed message, and a group of one waits
for its owner as a durable classic queue does (issue 23)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingConnection

from tests.cluster_harness import Cluster, MakeCluster
from tests.conftest import uid
from tests.support import clients

# serial: it kills servers and waits for failovers against the heartbeat
pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]


@pytest.fixture
def cluster(make_cluster: MakeCluster) -> Cluster:
    cluster = make_cluster(3, 0, interval=0.3, timeout=1.5, open_timeout=3.0)
    cluster.start_settled()
    return cluster


def connect(cluster: Cluster, index: int) -> BlockingConnection:
    return clients.connect(cluster.ports[index])


def address(cluster: Cluster, index: int) -> str:
    return f"127.0.0.1:{cluster.ports[index]}"


def row(cluster: Cluster, index: int, queue: str) -> dict[str, Any]:
    rows = cluster.ctl(index, "queues")["queues"]
    return next(r for r in rows if r["name"] == queue)


def copy_size(cluster: Cluster, index: int, queue: str) -> int:
    """Messages in server ``index``'s copy of ``queue`` (0: none)."""
    view = cluster.status(index, timeout=2.0) or {}
    return int(view["copies"]["queues"].get(queue, {}).get("messages", 0))


def publish(cluster: Cluster, index: int, queue: str, size: int, bodies: list[bytes]) -> None:
    """Declare quorum ``queue`` through ``index`` (client-local: it owns it) with a group
    of ``size``, and publish ``bodies`` persistent, each confirmed."""
    with connect(cluster, index) as conn:
        ch = conn.channel()
        ch.queue_declare(
            queue,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": size},
        )
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def drain(cluster: Cluster, index: int, queue: str, count: int) -> list[bytes]:
    """``count`` bodies consumed from ``queue`` through ``index`` and acked, in order;
    fewer if the queue goes quiet for 10 s (a group without its majority delivers
    nothing), then whatever else is left."""
    got: list[bytes] = []
    with connect(cluster, index) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        for method, _props, body in ch.consume(queue, inactivity_timeout=10):
            if method is None:
                break
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == count:
                break
        ch.cancel()
        while (m := ch.basic_get(queue, auto_ack=True))[0] is not None:
            got.append(m[2])
    return got


def owner_index(cluster: Cluster, queue: str, asked: int) -> int | None:
    owner = row(cluster, asked, queue)["owner"]
    return next((i for i in range(3) if cluster.spid(i) == owner), None)


def test_a_group_of_two_keeps_its_copies_on_its_members_and_fails_over_within_them(
    cluster: Cluster,
) -> None:
    queue = uid("group2")
    bodies = [b"g2-%04d:" % i + bytes([i % 256]) * (i % 700) for i in range(400)]
    publish(cluster, 1, queue, 2, bodies)
    group = row(cluster, 1, queue)["group"]
    assert group is not None and group[0] == address(cluster, 1) and len(group) == 2
    member = next(i for i in range(3) if address(cluster, i) == group[1])
    outsider = next(i for i in range(3) if i not in (1, member))
    cluster.wait_until(
        lambda: copy_size(cluster, member, queue) == len(bodies), timeout=10, what="the copy"
    )
    assert copy_size(cluster, outsider, queue) == 0  # its stream carried their numbers only
    states = row(cluster, 1, queue)["replicas"]
    assert [s["spid"] for s in states] == [cluster.spid(member)]
    data_dir = str(cluster.nodes[1].data_dir)
    table = subprocess.run(
        [sys.executable, "-m", "brokerd", "ctl", "--data-dir", data_dir, "queues"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    line = next(text for text in table.splitlines() if queue in text)
    assert line.endswith(f"1/1 in sync group {group[0]}, {group[1]}")
    dump = cluster.ctl(1, "dump")["dump"]
    assert f"group={group[0]},{group[1]}" in dump

    cluster.kill(1)
    cluster.wait_until(
        lambda: owner_index(cluster, queue, outsider) == member,
        timeout=30,
        what=f"the queue on its group's other member {member}",
    )
    # a group of two with one member away has no majority: it delivers nothing, as a
    # RabbitMQ quorum queue of two members with one down; its member back (a new
    # spid, the same address) takes the new owner's snapshot, and the queue goes on
    cluster.start(1)
    cluster.wait_until(
        lambda: copy_size(cluster, 1, queue) == len(bodies),
        timeout=30,
        what="the returned member's copy",
    )
    assert copy_size(cluster, outsider, queue) == 0
    assert drain(cluster, outsider, queue, len(bodies)) == bodies  # all confirmed, in order


def test_a_group_of_one_confirms_alone_and_waits_for_its_owner_to_return(
    cluster: Cluster,
) -> None:
    queue = uid("group1")
    bodies = [b"g1-%04d" % i for i in range(200)]
    publish(cluster, 2, queue, 1, bodies)
    assert row(cluster, 2, queue)["group"] == [address(cluster, 2)]
    assert row(cluster, 2, queue)["replicas"] == []
    assert copy_size(cluster, 0, queue) == copy_size(cluster, 1, queue) == 0
    cluster.kill(2)
    cluster.wait_until(
        lambda: row(cluster, 0, queue)["owner"] is None,
        timeout=30,
        what="the queue unavailable while its only member is away",
    )
    cluster.start(2)
    cluster.wait_until(
        lambda: owner_index(cluster, queue, 0) == 2,
        timeout=30,
        what="the queue back on its owner",
    )
    assert drain(cluster, 0, queue, len(bodies)) == bodies
