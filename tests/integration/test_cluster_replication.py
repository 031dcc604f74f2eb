"""Wiring replication through the root, with real brokerd processes and pika."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.cluster_harness import Cluster

pytestmark = pytest.mark.integration


def _started(base: Path) -> Iterator[Cluster]:
    """Three primaries and a secondary on loopback with a fast heartbeat."""
    c = Cluster(base, primaries=3, secondaries=1, open_timeout=8, fault_injection=False)
    try:
        c.start_all()
        c.wait_until(c.agreed_root)
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests that only wire and route (none kills a server):
    they use names of their own and compare state sequence numbers relatively."""
    yield from _started(tmp_path_factory.mktemp("shared"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of the test's own, for a test that kills a server."""
    yield from _started(tmp_path)


def agreed(cluster: Cluster, key: str) -> set[Any] | None:
    """The values of ``key`` in every server's status; None unless all of them answer."""
    views = cluster.sample(timeout=2.0)
    if len(views) != len(cluster.running()):
        return None
    return {view[key] for view in views.values()}


def channel(port: int) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    return conn, conn.channel()


def exists(port: int, kind: str, name: str) -> bool:
    conn, ch = channel(port)
    try:
        if kind == "exchange":
            ch.exchange_declare(name, passive=True)
        else:
            ch.queue_declare(name, passive=True)
        return True
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_wiring_declared_on_a_secondary_exists_everywhere_in_order(shared: Cluster) -> None:
    cluster = shared
    (seq,) = cluster.wait_until(lambda: agreed(cluster, "state_seq"))
    conn, ch = channel(cluster.ports[3])
    try:
        ch.exchange_declare("orders", "topic", durable=True)
        ch.queue_declare("billing", durable=True)
        ch.queue_bind("billing", "orders", "order.#")
        ch.queue_bind("billing", "amq.topic", "audit.#")
        private = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(private, "orders", "private.*")
    finally:
        conn.close()
    # the -Ok came after the root ordered each change: every server has it now
    for port in cluster.ports:
        assert exists(port, "exchange", "orders") and exists(port, "queue", "billing")
    # 4 shared changes, the private queue's two meta.binds (its name on the default
    # exchange, and its binding; neither holds the client) and their two meta.unbinds
    # when the connection closed, on every server in the same order
    cluster.wait_until(lambda: agreed(cluster, "state_seq") == {seq + 8})
    for port in cluster.ports:  # gone with its connection, and its name withdrawn
        assert not exists(port, "queue", private)


def test_a_private_queue_withdraws_its_meta_bindings_when_it_goes(shared: Cluster) -> None:
    cluster = shared
    (seq,) = cluster.wait_until(lambda: agreed(cluster, "state_seq"))
    conn, ch = channel(cluster.ports[2])
    private = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(private, "amq.fanout")
    # its name on the default exchange, and its binding
    cluster.wait_until(lambda: agreed(cluster, "state_seq") == {seq + 2})
    conn.close()  # the exclusive queue goes with its connection
    cluster.wait_until(lambda: agreed(cluster, "state_seq") == {seq + 4})


def test_routing_uses_replicated_bindings_on_every_server(shared: Cluster) -> None:
    cluster = shared
    conn, ch = channel(cluster.ports[1])
    ch.exchange_declare("fan", "fanout")
    ch.queue_declare("fan-q")
    ch.queue_bind("fan-q", "fan")
    conn.close()
    for port in cluster.ports:  # each server routes into its own copy of the queue
        conn, ch = channel(port)
        ch.basic_publish("fan", "", b"via-%d" % port)
        method, _props, body = None, None, None
        deadline = time.monotonic() + 5
        while method is None and time.monotonic() < deadline:
            method, _props, body = ch.basic_get("fan-q", auto_ack=True)
        assert body == b"via-%d" % port
        conn.close()


def test_inequivalent_redeclare_and_delete_propagate(shared: Cluster) -> None:
    cluster = shared
    conn, ch = channel(cluster.ports[0])
    ch.exchange_declare("shape", "direct")
    conn.close()
    conn, ch = channel(cluster.ports[2])
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare("shape", "fanout")
    assert info.value.reply_code == 406
    conn.close()
    conn, ch = channel(cluster.ports[2])
    ch.exchange_delete("shape")
    conn.close()
    for port in cluster.ports:
        assert not exists(port, "exchange", "shape")


def test_failover_keeps_the_state_and_a_returning_server_syncs(cluster: Cluster) -> None:
    conn, ch = channel(cluster.ports[0])
    ch.queue_declare("before-failover", durable=True)
    conn.close()
    index = next(i for i, view in cluster.sample().items() if view["is_root"])
    old_root = cluster.spid(index)
    cluster.kill(index)
    cluster.wait_until(lambda: cluster.agreed_root() not in (None, old_root))
    survivor = next(
        cluster.nodes[i] for i in cluster.running() if cluster.nodes[i].kind == "primary"
    )
    conn, ch = channel(survivor.port)
    ch.exchange_declare("after-failover", "fanout")
    ch.queue_delete("before-failover")
    conn.close()
    returning = cluster.start(index)
    cluster.wait_until(cluster.agreed_root)
    assert exists(returning.port, "exchange", "after-failover")
    assert not exists(returning.port, "queue", "before-failover")
    seqs = agreed(cluster, "state_seq")
    assert seqs is not None and len(seqs) == 1
