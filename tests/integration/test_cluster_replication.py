"""Wiring replication through the root, with real brokerd processes and pika."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from brokerd.server.control import request
from tests.brokerd_process import BrokerProcess, free_port

pytestmark = pytest.mark.integration


class MiniCluster:
    """Three primaries and a secondary on loopback with a fast heartbeat."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = [free_port() for _ in range(4)]
        self.file = root / "cluster.toml"
        hosts = ", ".join(f'"127.0.0.1:{p}"' for p in self.ports[:3])
        self.file.write_text(
            'name = "repl"\nsecret = "replication-secret"\n'
            f"known_hosts = [{hosts}]\n"
            "[heartbeat]\ninterval = 0.3\ntimeout = 1.0\nopen_timeout = 8\n"
        )
        self.servers: list[BrokerProcess] = []

    def start(self, index: int) -> BrokerProcess:
        extra = ["--cluster", str(self.file)]
        if index == 3:
            extra += ["--type", "secondary"]
        proc = BrokerProcess(self.root / f"n{index}", port=self.ports[index], extra_args=extra)
        proc.start()
        if index < len(self.servers):
            self.servers[index] = proc
        else:
            self.servers.append(proc)
        return proc

    def status(self, proc: BrokerProcess) -> dict[str, Any]:
        reply = request(proc.data_dir, "status", timeout=2.0)
        assert reply["ok"], reply
        return reply["result"]

    def alive(self) -> list[BrokerProcess]:
        return [s for s in self.servers if s.alive()]

    def wait(self, predicate: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except (OSError, AssertionError, KeyError):
                pass
            time.sleep(0.1)
        raise AssertionError(
            f"condition not met in {timeout}s: {[self.status(s) for s in self.alive()]}"
        )

    def all_ready(self) -> bool:
        statuses = [self.status(s) for s in self.alive()]
        roots = {s["root"] for s in statuses}
        return len(roots) == 1 and None not in roots and all(s["ready"] for s in statuses)

    def stop(self) -> None:
        for proc in self.servers:
            if proc.proc is not None and proc.alive():
                proc.proc.send_signal(signal.SIGCONT)
            proc.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MiniCluster]:
    c = MiniCluster(tmp_path)
    try:
        for i in range(4):
            c.start(i)
            time.sleep(0.15)
        c.wait(c.all_ready)
        yield c
    finally:
        c.stop()


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


def test_wiring_declared_on_a_secondary_exists_everywhere_in_order(cluster: MiniCluster) -> None:
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
        assert not exists(port, "queue", private) or port == cluster.ports[3]
    # 4 shared changes, the private queue's meta.bind (which does not hold the client)
    # and its meta.unbind when the connection closed, on every server in the same order
    cluster.wait(lambda: {cluster.status(s)["state_seq"] for s in cluster.servers} == {6})


def test_a_private_queue_withdraws_its_meta_bindings_when_it_goes(cluster: MiniCluster) -> None:
    conn, ch = channel(cluster.ports[2])
    private = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(private, "amq.fanout")
    cluster.wait(lambda: {cluster.status(s)["state_log"] for s in cluster.servers} == {1})
    conn.close()  # the exclusive queue goes with its connection
    cluster.wait(lambda: {cluster.status(s)["state_seq"] for s in cluster.servers} == {2})


def test_routing_uses_replicated_bindings_on_every_server(cluster: MiniCluster) -> None:
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


def test_inequivalent_redeclare_and_delete_propagate(cluster: MiniCluster) -> None:
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


def test_failover_keeps_the_state_and_a_returning_server_syncs(cluster: MiniCluster) -> None:
    conn, ch = channel(cluster.ports[0])
    ch.queue_declare("before-failover", durable=True)
    conn.close()
    root = next(s for s in cluster.servers if cluster.status(s)["is_root"])
    old_root = cluster.status(root)["spid"]
    index = cluster.servers.index(root)
    root.proc.kill()
    root.proc.wait(5)
    cluster.wait(
        lambda: cluster.all_ready() and cluster.status(cluster.alive()[0])["root"] != old_root
    )
    survivor = next(s for s in cluster.alive() if cluster.status(s)["type"] == "primary")
    conn, ch = channel(survivor.port)
    ch.exchange_declare("after-failover", "fanout")
    ch.queue_delete("before-failover")
    conn.close()
    returning = cluster.start(index)
    cluster.wait(cluster.all_ready)
    assert exists(returning.port, "exchange", "after-failover")
    assert not exists(returning.port, "queue", "before-failover")
    seqs = {cluster.status(s)["state_seq"] for s in cluster.alive()}
    assert len(seqs) == 1
