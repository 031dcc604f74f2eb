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
from tests.support.bridges import Running

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
