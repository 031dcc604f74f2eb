"""A shovel between two real brokerd processes (issue 42): every message moved byte for
byte with its properties, nothing lost when the destination is killed -9 mid-transfer,
and refusals reported with the broker's own reason."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from brokerd.bridges.runner import RUNNING, TERMINATED
from brokerd.bridges.transfer import SHOVELLED
from tests.brokerd_process import BrokerProcess
from tests.support.bridges import Running

pytestmark = pytest.mark.integration

COUNT = 3000


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    source = BrokerProcess(tmp_path / "source").start()
    destination = BrokerProcess(tmp_path / "destination").start()
    try:
        yield source, destination
    finally:
        for proc in (source, destination):
            if proc.stop() not in (0, None):
                print(proc.log_text()[-4000:])


def _channel(port: int) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=30))
    return conn, conn.channel()


def _depth(port: int, queue: str) -> int:
    conn, ch = _channel(port)
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def _fill(port: int, queue: str, count: int) -> list[tuple[bytes, pika.BasicProperties]]:
    conn, ch = _channel(port)
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    sent = []
    for i in range(count):
        body = (f"{i:06d}-".encode() + bytes(range(256)) * (i % 7))[: 1 + (i * 37) % 3000]
        props = pika.BasicProperties(
            delivery_mode=2,
            content_type="application/octet-stream" if i % 2 else None,
            headers={"n": i, "tag": "x" * (i % 5)} if i % 3 else None,
            correlation_id=f"c{i}" if i % 4 == 0 else None,
        )
        ch.basic_publish("", queue, body, props)
        sent.append((body, props))
    conn.close()
    return sent


def _drain(port: int, queue: str) -> list[tuple[bytes, Any, bool]]:
    conn, ch = _channel(port)
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((body, props, method.redelivered))
    conn.close()
    return got


def test_a_shovel_moves_every_message_byte_for_byte_with_its_properties(
    two_brokers: tuple[BrokerProcess, BrokerProcess],
) -> None:
    source, destination = two_brokers
    sent = _fill(source.port, "outbox", COUNT)
    shovel = Running(
        {
            "src-uri": source.url,
            "src-queue": "outbox",
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{destination.port}?heartbeat=5",
            "dest-queue": "inbox",
            "src-prefetch-count": 200,
        }
    )
    try:
        shovel.wait(
            lambda: shovel.status()["acknowledged"] == COUNT, 60, "every message acknowledged"
        )
        assert shovel.status()["state"] == RUNNING
        shovel.wait(lambda: _depth(source.port, "outbox") == 0, 10, "the source emptied")
    finally:
        shovel.stop()
    got = _drain(destination.port, "inbox")
    assert len(got) == COUNT
    for (body, props), (got_body, got_props, _redelivered) in zip(sent, got, strict=True):
        assert got_body == body
        assert got_props.headers == props.headers  # no x-shovelled unless asked for
        assert got_props.content_type == props.content_type
        assert got_props.correlation_id == props.correlation_id
        assert got_props.delivery_mode == 2
        assert got_props.message_id is None, "the shovel added nothing of its own"
    assert "guest:guest" not in str(shovel.status())


def test_forward_headers_and_an_exchange_destination(
    two_brokers: tuple[BrokerProcess, BrokerProcess],
) -> None:
    source, destination = two_brokers
    conn, ch = _channel(destination.port)
    ch.exchange_declare("archive", "topic", durable=True)
    ch.queue_declare("eu", durable=True)
    ch.queue_bind("eu", "archive", "eu.#")
    conn.close()
    _fill(source.port, "outbox", 50)
    shovel = Running(
        {
            "src-uri": source.url,
            "src-queue": "outbox",
            "dest-uri": f"amqp://guest:secret-not-shown@127.0.0.1:{destination.port}",
            "dest-exchange": "archive",
            "dest-exchange-key": "eu.orders",
            "dest-add-forward-headers": True,
        }
    )
    try:
        shovel.wait(lambda: shovel.status()["state"] != "starting", 20, "the first session")
        status = shovel.status()
        # the destination refuses guest's wrong password: the broker's reason, no secret
        assert status["state"] == TERMINATED and "403" in status["reason"], status
        assert "secret-not-shown" not in str(status)
    finally:
        shovel.stop()
    shovel = Running(
        {
            "src-uri": source.url,
            "src-queue": "outbox",
            "dest-uri": destination.url,
            "dest-exchange": "archive",
            "dest-exchange-key": "eu.orders",
            "dest-add-forward-headers": True,
        }
    )
    try:
        shovel.wait(lambda: shovel.status()["acknowledged"] == 50, 30, "50 moved")
    finally:
        shovel.stop()
    got = _drain(destination.port, "eu")
    assert len(got) == 50
    trail = got[0][1].headers[SHOVELLED]
    assert trail[0]["shovel-name"] == "s" and trail[0]["src-queue"] == "outbox"
    assert trail[0]["dest-exchange"] == "archive"


def test_a_missing_destination_exchange_is_reported_as_the_broker_says(
    two_brokers: tuple[BrokerProcess, BrokerProcess],
) -> None:
    source, destination = two_brokers
    shovel = Running(
        {
            "src-uri": source.url,
            "src-queue": "outbox",
            "dest-uri": destination.url,
            "dest-exchange": "nowhere",
            "reconnect-delay": 0.2,
        }
    )
    try:
        shovel.wait(lambda: shovel.status()["state"] == TERMINATED, 20, "terminated")
        assert "404" in shovel.status()["reason"] and "nowhere" in shovel.status()["reason"]
        conn, ch = _channel(destination.port)
        ch.exchange_declare("nowhere", "fanout", durable=True)
        ch.queue_declare("found", durable=True)
        ch.queue_bind("found", "nowhere")
        conn.close()
        _fill(source.port, "outbox", 10)
        # retried at the backoff: the far side fixed, it runs on its own
        shovel.wait(lambda: shovel.status()["acknowledged"] == 10, 30, "running once fixed")
    finally:
        shovel.stop()
    assert len(_drain(destination.port, "found")) == 10


def test_kill_9_of_the_destination_mid_transfer_loses_nothing(
    two_brokers: tuple[BrokerProcess, BrokerProcess],
) -> None:
    source, destination = two_brokers
    count = 6000
    sent_list = [body for body, _p in _fill(source.port, "outbox", count)]
    sent = set(sent_list)
    conn, ch = _channel(destination.port)
    ch.queue_declare("inbox", durable=True)
    conn.close()
    shovel = Running(
        {
            "src-uri": source.url,
            "src-queue": "outbox",
            "dest-uri": f"{destination.url}?heartbeat=2",
            "dest-queue": "inbox",
            "src-prefetch-count": 100,
            "reconnect-delay": 0.2,
        }
    )
    try:
        shovel.wait(lambda: shovel.status()["acknowledged"] > count // 4, 60, "a quarter moved")
        destination.signal(signal.SIGKILL)
        assert destination.proc is not None
        destination.proc.wait(10)
        shovel.wait(lambda: shovel.status()["state"] != RUNNING, 10, "the session ended")
        before = shovel.status()["acknowledged"]
        assert before < count, "the kill came after the end: nothing tested"
        destination.start()
        shovel.wait(lambda: shovel.status()["acknowledged"] >= count, 90, "every message moved")
        assert shovel.status()["sessions"] >= 2
    finally:
        shovel.stop()
    assert _depth(source.port, "outbox") == 0
    got = _drain(destination.port, "inbox")
    bodies = [body for body, _p, _r in got]
    assert set(bodies) == sent, f"lost {len(sent - set(bodies))}"
    # a copy the destination stored but had not confirmed when it died comes again,
    # flagged x-redelivered (the fill itself repeats a few short bodies: compared as
    # multisets)
    extra = Counter(bodies) - Counter(sent_list)
    assert sum(extra.values()) <= 100, "at most the window is duplicated"
    flagged = Counter(b for b, p, _r in got if (p.headers or {}).get("x-redelivered"))
    assert all(flagged[b] >= n for b, n in extra.items()), "a copy again without x-redelivered"
