"""Shovels between brokerd and RabbitMQ 3.10 (Debian's rabbitmq-server, its bundled
rabbitmq_shovel plugin), both ways and by either side's shovel, every message
counted (issue 42's interoperability proof, shovel half)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from brokerd.bench.cluster import RABBITMQ_BIN, RabbitCluster
from tests.brokerd_process import BrokerProcess
from tests.support.bridges import Running, ctl_json

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (RABBITMQ_BIN / "rabbitmq-server").exists() and shutil.which("rabbitmq-server") is None,
        reason="rabbitmq-server is not installed (.ci/run installs it)",
    ),
]

COUNT = 2000


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    node = RabbitCluster(
        tmp_path_factory.mktemp("rabbit"),
        size=1,
        plugins=("rabbitmq_shovel", "rabbitmq_federation"),
        name=f"rkshovel{os.getpid()}x",
    )
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def rookery(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "rookery").start()
    try:
        yield proc
    finally:
        if proc.stop() not in (0, None):
            print(proc.log_text()[-4000:])


def _publish(port: int, queue: str, count: int, tag: str) -> set[bytes]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    sent = set()
    for i in range(count):
        body = f"{tag}-{i}".encode() + b"." * (i % 300)
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        sent.add(body)
    conn.close()
    return sent


def _drain(port: int, queue: str) -> list[bytes]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    got = []
    while (message := ch.basic_get(queue, auto_ack=True))[0] is not None:
        got.append(message[2])
    conn.close()
    return got


def _depth(port: int, queue: str) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        return conn.channel().queue_declare(queue, durable=True).method.message_count
    finally:
        conn.close()


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s")


def test_a_rookery_shovel_moves_from_rabbitmq_into_rookery(
    rabbit: RabbitCluster, rookery: BrokerProcess
) -> None:
    sent = _publish(rabbit.ports[0], "rk-out", COUNT, "r2k")
    shovel = Running(
        {
            "src-uri": f"amqp://guest:guest@127.0.0.1:{rabbit.ports[0]}",
            "src-queue": "rk-out",
            "dest-uri": rookery.url,
            "dest-queue": "from-rabbit",
            "dest-add-forward-headers": True,
        }
    )
    try:
        shovel.wait(lambda: shovel.status()["acknowledged"] == COUNT, 60, "every message")
    finally:
        shovel.stop()
    got = _drain(rookery.port, "from-rabbit")
    assert len(got) == COUNT and set(got) == sent
    assert _depth(rabbit.ports[0], "rk-out") == 0


def test_a_rookery_shovel_moves_from_rookery_into_rabbitmq(
    rabbit: RabbitCluster, rookery: BrokerProcess
) -> None:
    sent = _publish(rookery.port, "k-out", COUNT, "k2r")
    shovel = Running(
        {
            "src-uri": rookery.url,
            "src-queue": "k-out",
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{rabbit.ports[0]}",
            "dest-queue": "from-rookery",
        }
    )
    try:
        shovel.wait(lambda: shovel.status()["acknowledged"] == COUNT, 60, "every message")
    finally:
        shovel.stop()
    got = _drain(rabbit.ports[0], "from-rookery")
    assert len(got) == COUNT and set(got) == sent


def test_rabbitmqs_own_shovel_pulls_from_rookery(
    rabbit: RabbitCluster, rookery: BrokerProcess
) -> None:
    sent = _publish(rookery.port, "for-rabbit", COUNT, "rshovel")
    definition = {
        "src-protocol": "amqp091",
        "src-uri": rookery.url,
        "src-queue": "for-rabbit",
        "dest-protocol": "amqp091",
        "dest-uri": "amqp://",
        "dest-queue": "pulled",
        "ack-mode": "on-confirm",
    }
    rabbit.ctl(0, "set_parameter", "shovel", "pull-from-rookery", json.dumps(definition))
    try:
        _eventually(lambda: _depth(rabbit.ports[0], "pulled") == COUNT, 60, "RabbitMQ's shovel")
        _eventually(lambda: _depth(rookery.port, "for-rabbit") == 0, 10, "the source emptied")
    finally:
        rabbit.ctl(0, "clear_parameter", "shovel", "pull-from-rookery")
    got = _drain(rabbit.ports[0], "pulled")
    assert len(got) == COUNT and set(got) == sent


def test_rabbitmqs_own_shovel_pushes_into_rookery(
    rabbit: RabbitCluster, rookery: BrokerProcess
) -> None:
    sent = _publish(rabbit.ports[0], "to-rookery", COUNT, "rpush")
    definition = {
        "src-uri": "amqp://",
        "src-queue": "to-rookery",
        "dest-uri": rookery.url,
        "dest-queue": "pushed",
        "dest-add-forward-headers": True,
    }
    rabbit.ctl(0, "set_parameter", "shovel", "push-to-rookery", json.dumps(definition))
    try:
        _eventually(lambda: _depth(rookery.port, "pushed") == COUNT, 60, "RabbitMQ's shovel")
    finally:
        rabbit.ctl(0, "clear_parameter", "shovel", "push-to-rookery")
    got = _drain(rookery.port, "pushed")
    assert len(got) == COUNT and set(got) == sent


def test_rabbitmq_federates_an_exchange_from_rookery(
    rabbit: RabbitCluster, rookery: BrokerProcess
) -> None:
    """RabbitMQ's federation link declares an x-federation-upstream exchange and its
    queue on Rookery, binds them to the upstream exchange with the downstream's
    binding keys, and carries what matches; what no downstream binding wants never
    leaves Rookery."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rookery.port))
    upstream = conn.channel()
    upstream.exchange_declare("fed.orders", "topic", durable=True)
    down = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rabbit.ports[0]))
    downstream = down.channel()
    downstream.exchange_declare("fed.orders", "topic", durable=True)
    downstream.queue_declare("fed-eu", durable=True)
    downstream.queue_bind("fed-eu", "fed.orders", "eu.#")
    down.close()
    rabbit.ctl(
        0,
        "set_parameter",
        "federation-upstream",
        "rookery",
        json.dumps({"uri": rookery.url, "max-hops": 1, "expires": 60000}),
    )
    rabbit.ctl(
        0,
        "set_policy",
        "federate",
        "^fed\\.",
        '{"federation-upstream-set":"all"}',
        "--apply-to",
        "exchanges",
    )
    try:
        # the link is up once a probe published on Rookery arrives at RabbitMQ
        def probe_arrived() -> bool:
            upstream.basic_publish("fed.orders", "eu.probe", b"probe")
            time.sleep(0.3)
            return _depth(rabbit.ports[0], "fed-eu") > 0

        _eventually(probe_arrived, 60, "the federation link")
        _drain(rabbit.ports[0], "fed-eu")
        upstream.confirm_delivery()
        for i in range(COUNT):
            upstream.basic_publish("fed.orders", "eu.new" if i % 2 else "us.new", f"o{i}".encode())
        _eventually(
            lambda: _depth(rabbit.ports[0], "fed-eu") >= COUNT // 2, 60, "the federated messages"
        )
        time.sleep(1.0)  # anything beyond would show now
        got = _drain(rabbit.ports[0], "fed-eu")
        assert sorted(got) == sorted(f"o{i}".encode() for i in range(1, COUNT, 2))
        # the link took the upstream exchange type (else it retries with a fanout,
        # leaving loop prevention to the downstream alone)
        assert "unknown exchange type 'x-federation-upstream'" not in rookery.log_text()
    finally:
        rabbit.ctl(0, "clear_policy", "federate")
        rabbit.ctl(0, "clear_parameter", "federation-upstream", "rookery")
        conn.close()


def test_rookery_federates_an_exchange_from_rabbitmq(
    rabbit: RabbitCluster, rookery: BrokerProcess
) -> None:
    """Rookery downstream of RabbitMQ: its link declares RabbitMQ's own
    x-federation-upstream exchange and queue there, binds them with Rookery's
    binding keys, and brings back only what they want, every message counted."""
    up = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rabbit.ports[0]))
    upstream = up.channel()
    upstream.exchange_declare("fed.rates", "direct", durable=True)
    down = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rookery.port))
    downstream = down.channel()
    downstream.exchange_declare("fed.rates", "direct", durable=True)
    downstream.queue_declare("eur", durable=True)
    downstream.queue_bind("eur", "fed.rates", "eur")
    down.close()
    definition = {"uri": f"amqp://127.0.0.1:{rabbit.ports[0]}", "max-hops": 1, "expires": 60000}
    policy = {
        "pattern": "^fed\\.",
        "definition": {"federation-upstream-set": "all"},
        "apply-to": "exchanges",
    }
    ctl_json(rookery, "federation", "set", "federation-upstream", "rabbit", json.dumps(definition))
    ctl_json(rookery, "federation", "set", "policy", "federate", json.dumps(policy))
    try:

        def probe_arrived() -> bool:
            upstream.basic_publish("fed.rates", "eur", b"probe")
            time.sleep(0.3)
            return _depth(rookery.port, "eur") > 0

        try:
            _eventually(probe_arrived, 60, "the federation link")
        except AssertionError as exc:
            links = ctl_json(rookery, "federation", "status", "--json")
            raise AssertionError(f"{exc}: {links}") from None
        _drain(rookery.port, "eur")
        upstream.confirm_delivery()
        for i in range(COUNT):
            upstream.basic_publish("fed.rates", "eur" if i % 2 else "usd", f"r{i}".encode())
        _eventually(lambda: _depth(rookery.port, "eur") >= COUNT // 2, 60, "the federated messages")
        time.sleep(1.0)  # anything beyond would show now
        got = _drain(rookery.port, "eur")
        assert sorted(got) == sorted(f"r{i}".encode() for i in range(1, COUNT, 2))
    finally:
        ctl_json(rookery, "federation", "delete", "policy", "federate")
        up.close()
