"""brokerd driven by kombu over py-amqp, the stack Celery uses.

Set ``ROOKERY_REFERENCE_AMQP_PORT=5672`` to run these tests against a real
RabbitMQ on 127.0.0.1 (guest/guest) and compare.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from queue import Empty

import amqp.exceptions
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.message import Message

from tests.conftest import uid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def amqp_url(amqp_port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{amqp_port}//"


@pytest.fixture
def conn(amqp_url: str) -> Iterator[Connection]:
    # confirmed publishing: queue depths seen right after a publish are then exact
    options = {"confirm_publish": True}
    with Connection(amqp_url, connect_timeout=5, transport_options=options) as connection:
        connection.ensure_connection(max_retries=1)
        yield connection


def drain_until(conn: Connection, received: list, want: int, timeout: float = 5.0) -> None:
    """Drain events until ``received`` holds ``want`` items; fail on timeout."""
    deadline = time.monotonic() + timeout
    while len(received) < want:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"got {len(received)} of {want} messages in {timeout}s")
        try:
            conn.drain_events(timeout=min(remaining, 0.5))
        except TimeoutError:
            continue


def test_producer_consumer_round_trip(conn: Connection) -> None:
    exchange = Exchange(uid("x"), type="direct", durable=False)
    queue = Queue(uid("q"), exchange=exchange, routing_key="work", durable=False)
    producer = Producer(conn.channel(), exchange=exchange)
    for i in range(3):
        producer.publish(
            {"n": i, "text": "héllo"},
            routing_key="work",
            serializer="json",
            declare=[queue],
            headers={"attempt": i},
            retry=False,
        )
    received: list[tuple[dict, dict]] = []

    def on_message(body: dict, message: Message) -> None:
        received.append((body, message.headers))
        message.ack()

    with Consumer(conn.channel(), queues=[queue], callbacks=[on_message], accept=["json"]):
        drain_until(conn, received, 3)
    assert [body for body, _h in received] == [{"n": i, "text": "héllo"} for i in range(3)]
    assert [headers["attempt"] for _b, headers in received] == [0, 1, 2]
    # all acked: the queue is empty
    _name, count, _consumers = queue(conn.channel()).queue_declare(passive=True)
    assert count == 0


def test_simple_queue_round_trip(conn: Connection) -> None:
    name = uid("simple")
    with conn.SimpleQueue(name, serializer="json") as queue:
        queue.put({"hello": "world"})
        queue.put([1, 2, 3])
        assert queue.qsize() == 2
        first = queue.get(block=True, timeout=5)
        assert first.payload == {"hello": "world"}
        first.ack()
        second = queue.get(block=True, timeout=5)
        assert second.payload == [1, 2, 3]
        second.ack()
        with pytest.raises(Empty):
            queue.get_nowait()
        with pytest.raises(Empty):
            queue.get(block=True, timeout=0.5)
    conn.channel().queue_delete(name)


def test_a_simple_queue_deletes_the_queue_it_consumes_from(conn: Connection) -> None:
    """queue.delete-ok comes before the basic.cancel of the deleting channel's own
    consumer, as on RabbitMQ: in the other order py-amqp raised ConsumerCancelled
    from the delete itself. The cancel follows, as it does on RabbitMQ, and py-amqp
    raises it on the next read."""
    name = uid("simple-delete")
    queue = conn.SimpleQueue(name, serializer="json")
    queue.put({"n": 1})
    queue.get(block=True, timeout=5).ack()
    assert queue.queue.delete() == 0
    with pytest.raises(amqp.exceptions.ConsumerCancelled):
        conn.drain_events(timeout=5)


def test_requeue_sets_redelivered(conn: Connection) -> None:
    name = uid("q")
    queue = Queue(name, routing_key=name, durable=False)  # via the default exchange
    Producer(conn.channel()).publish(
        b"again",
        routing_key=queue.name,
        declare=[queue],
        serializer=None,
        content_type="application/octet-stream",
        content_encoding="binary",
        retry=False,
    )
    seen: list[tuple[bool, bytes]] = []

    def on_message(body: bytes, message: Message) -> None:
        seen.append((message.delivery_info["redelivered"], body))
        if len(seen) == 1:
            message.requeue()
        else:
            message.ack()

    with Consumer(
        conn.channel(), queues=[queue], callbacks=[on_message], accept=["application/octet-stream"]
    ):
        drain_until(conn, seen, 2)
    assert seen == [(False, b"again"), (True, b"again")]


def test_reject_drops_and_get_returns_none(conn: Connection) -> None:
    name = uid("simple")
    with conn.SimpleQueue(name) as queue:
        queue.put("unwanted")
        message = queue.get(timeout=5)
        message.reject()
        with pytest.raises(Empty):
            queue.get_nowait()
        assert queue.qsize() == 0
    conn.channel().queue_delete(name)


def test_topic_exchange(conn: Connection) -> None:
    exchange = Exchange(uid("topic"), type="topic", durable=False, auto_delete=True)
    errors = Queue(uid("errors"), exchange, routing_key="*.error", durable=False)
    everything = Queue(uid("all"), exchange, routing_key="app.#", durable=False)
    channel = conn.channel()
    for q in (errors, everything):
        q(channel).declare()
    producer = Producer(channel, exchange=exchange)
    for key in ("app.error", "app.info", "app.db.error", "db.error"):
        producer.publish({"key": key}, routing_key=key, retry=False)
    got: dict[str, list[str]] = {"errors": [], "all": []}
    with (
        Consumer(
            channel,
            queues=[errors],
            callbacks=[lambda body, m: (got["errors"].append(body["key"]), m.ack())],
        ),
        Consumer(
            conn.channel(),
            queues=[everything],
            callbacks=[lambda body, m: (got["all"].append(body["key"]), m.ack())],
        ),
    ):
        drain_until(conn, got["all"], 3)
        drain_until(conn, got["errors"], 2)
    assert got["errors"] == ["app.error", "db.error"]
    assert got["all"] == ["app.error", "app.info", "app.db.error"]


def test_headers_exchange(conn: Connection) -> None:
    exchange = Exchange(uid("headers"), type="headers", durable=False)
    queue = Queue(
        uid("pdf"),
        exchange,
        durable=False,
        binding_arguments={"x-match": "all", "format": "pdf", "lang": "en"},
    )
    channel = conn.channel()
    queue(channel).declare()
    producer = Producer(channel, exchange=exchange)
    producer.publish("match", headers={"format": "pdf", "lang": "en", "extra": 1}, retry=False)
    producer.publish("partial", headers={"format": "pdf"}, retry=False)
    received: list[str] = []
    with Consumer(
        channel, queues=[queue], callbacks=[lambda body, m: (received.append(body), m.ack())]
    ):
        drain_until(conn, received, 1)
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.3)
    assert received == ["match"]


def test_confirm_publish_nack_raises(amqp_url: str) -> None:
    with Connection(
        amqp_url, connect_timeout=5, transport_options={"confirm_publish": True}
    ) as conn:
        name = uid("full")
        queue = Queue(
            name,
            routing_key=name,
            durable=False,
            queue_arguments={
                "x-max-length": 1,
                "x-overflow": "reject-publish",
            },
        )
        producer = Producer(conn.channel())
        producer.publish("fits", routing_key=queue.name, declare=[queue], retry=False)
        with pytest.raises(amqp.exceptions.MessageNacked):
            producer.publish("overflows", routing_key=queue.name, retry=False)


def test_missing_queue_passive_declare_is_404(conn: Connection) -> None:
    queue = Queue(uid("missing"), durable=False)
    with pytest.raises(amqp.exceptions.NotFound) as info:
        queue(conn.channel()).queue_declare(passive=True)
    assert info.value.reply_code == 404
    assert conn.connected


def test_wrong_password_is_refused(amqp_url: str) -> None:
    url = amqp_url.replace("guest:guest", "guest:wrong")
    with Connection(url, connect_timeout=5) as conn, pytest.raises(amqp.exceptions.AccessRefused):
        conn.connect()
