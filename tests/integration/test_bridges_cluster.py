"""Bridges in a cluster (issue 42): the console's configuration document defines them,
the root places each on one server, and it moves when that server is killed, with
nothing lost under ``on-confirm`` and every copy it forwards twice flagged."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.brokerd_process import BrokerProcess
from tests.cluster_harness import Cluster
from tests.support.console_fake import FakeConsole

pytestmark = pytest.mark.integration

MESSAGES = 400


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Cluster, FakeConsole, BrokerProcess]]:
    console = FakeConsole().start()
    far = BrokerProcess(tmp_path / "far").start()
    cluster = Cluster(tmp_path / "c", primaries=3, secondaries=0)
    try:
        console.link_cluster(cluster, 3)
        yield cluster, console, far
    finally:
        cluster.close()
        if far.stop() not in (0, None):
            print(far.log_text()[-4000:])
        console.stop()


def running_on(cluster: Cluster) -> list[int]:
    """The servers whose ``ctl bridges status`` shows the bridge running."""
    return [
        index
        for index in cluster.running()
        if any(b["state"] == "running" for b in cluster.ctl(index, "bridges", "status")["bridges"])
    ]


def publish(port: int, start: int, count: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(start, start + count):
        ch.basic_publish("", "bq", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()


def landed(far: BrokerProcess) -> list[tuple[bytes, bool]]:
    """What the destination holds: (body, flagged by the bridge), drained."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", far.port))
    ch = conn.channel()
    out = []
    while True:
        method, props, body = ch.basic_get("landed", auto_ack=True)
        if method is None:
            break
        out.append((body, bool((props.headers or {}).get("x-redelivered"))))
    conn.close()
    return out


def test_a_documented_bridge_runs_on_one_server_and_moves_when_it_is_killed(
    setup: tuple[Cluster, FakeConsole, BrokerProcess],
) -> None:
    cluster, console, far = setup
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", far.port)) as conn:
        conn.channel().queue_declare("landed", durable=True)
    with pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", cluster.nodes[0].port)
    ) as conn:
        conn.channel().queue_declare("bq", durable=True)
    bridge = {
        "name": "to-far",
        "vhost": "/",
        "value": {
            "src-uri": "amqp://",
            "src-queue": "bq",
            "src-prefetch-count": 50,
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{far.port}",
            "dest-queue": "landed",
        },
    }
    console.apply_config(2, {"bridges": [bridge]}, 3)
    on = cluster.wait_until(lambda: running_on(cluster), timeout=20, what="the bridge running")
    assert len(on) == 1, on  # one server runs it
    listed = [cluster.ctl(i, "bridges", "list")["bridges"] for i in range(3)]
    assert all(len(rows) == 1 for rows in listed)
    assert {rows[0]["node"] for rows in listed} == {cluster.spid(on[0])}  # all agree where
    assert all("guest:guest" not in str(rows) for rows in listed)  # the password redacted

    survivors = [i for i in range(3) if i != on[0]]
    publish(cluster.nodes[survivors[0]].port, 0, MESSAGES)
    cluster.kill(on[0])  # kill -9 of the server running it, while it forwards
    publish(cluster.nodes[survivors[1]].port, MESSAGES, MESSAGES)
    moved = cluster.wait_until(
        lambda: running_on(cluster), timeout=30, what="the bridge running elsewhere"
    )
    assert moved and moved[0] in survivors
    want = {b"m%d" % i for i in range(2 * MESSAGES)}
    got: list[tuple[bytes, bool]] = []

    def all_landed() -> bool:
        got.extend(landed(far))
        return {body for body, _f in got} >= want

    cluster.wait_until(all_landed, timeout=60, what=f"all {2 * MESSAGES} at the destination")
    counts = Counter(body for body, _f in got)
    unflagged = Counter(body for body, flagged in got if not flagged)
    assert all(n == 1 for n in unflagged.values()), "a copy twice, unflagged"
    assert set(counts) == want


def linked_on(cluster: Cluster) -> list[int]:
    """The servers whose ``ctl federation status`` shows a link running."""
    return [
        index
        for index in cluster.running()
        if any(r["state"] == "running" for r in cluster.ctl(index, "federation", "status")["links"])
    ]


def test_a_documented_federation_runs_on_the_root_and_follows_it(
    setup: tuple[Cluster, FakeConsole, BrokerProcess],
) -> None:
    """The document's upstream and policy federate the cluster's exchange from a far
    broker: the link runs on the root alone, moves with the root when it is killed,
    and carries, after the move, what the cluster's bindings want."""
    cluster, console, far = setup
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", far.port)) as conn:
        conn.channel().exchange_declare("fed.x", "direct", durable=True)
    with pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", cluster.nodes[1].port)
    ) as conn:
        ch = conn.channel()
        ch.exchange_declare("fed.x", "direct", durable=True)
        ch.queue_declare("fq", durable=True)
        ch.queue_bind("fq", "fed.x", "k")
    upstream = {
        "name": "far",
        "vhost": "/",
        "value": {"uri": f"amqp://guest:guest@127.0.0.1:{far.port}", "reconnect-delay": 1},
    }
    policy = {
        "name": "fed",
        "vhost": "/",
        "pattern": "^fed\\.",
        "apply-to": "exchanges",
        "definition": {"federation-upstream-set": "all"},
    }
    console.apply_config(2, {"federation_upstreams": [upstream], "policies": [policy]}, 3)
    root = cluster.root_index()
    on = cluster.wait_until(lambda: linked_on(cluster), timeout=20, what="the link running")
    assert on == [root]
    refused = cluster.ctl(0, "federation", "list")["definitions"]
    assert all("guest:guest" not in str(d) for d in refused)
    cluster.kill(root)
    survivors = [i for i in range(3) if i != root]
    moved = cluster.wait_until(
        lambda: linked_on(cluster), timeout=30, what="the link running on the new root"
    )
    assert moved == [cluster.root_index()] and moved[0] in survivors
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", far.port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("fed.x", "k" if i % 2 else "other", b"f%d" % i)
    with pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", cluster.nodes[survivors[0]].port)
    ) as conn:
        ch = conn.channel()
        got: list[bytes] = []

        def arrived() -> bool:
            while (message := ch.basic_get("fq", auto_ack=True))[0] is not None:
                got.append(message[2])
            return len(got) >= 50

        cluster.wait_until(arrived, timeout=30, what="the federated messages")
    assert sorted(got) == sorted(b"f%d" % i for i in range(1, 100, 2))
