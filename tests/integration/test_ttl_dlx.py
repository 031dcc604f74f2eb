"""Queue TTL, x-expires, dead-lettering and requeue order, driven by pika.

Each test runs against a standalone brokerd and against a non-root server of
a three-primary cluster (where every shared queue is mastered elsewhere, so
TTL timers, x-expires and dead-lettering act on the root). Set
``ROOKERY_REFERENCE_AMQP_PORT`` to run them against RabbitMQ 3.10 instead:
they assert what RabbitMQ does.
"""

from __future__ import annotations

import datetime
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import ChannelClosedByBroker

from brokerd.bench.client import Client
from brokerd.bench.frames import AMQPURL
from brokerd.wire import tables
from tests.conftest import uid
from tests.support.eventually import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def conn(amqp_port: int) -> Iterator[BlockingConnection]:
    connection = BlockingConnection(
        pika.ConnectionParameters(
            host="127.0.0.1", port=amqp_port, connection_attempts=1, socket_timeout=5
        )
    )
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def ch(conn: BlockingConnection) -> BlockingChannel:
    channel = conn.channel()
    channel.confirm_delivery()  # a publish is in its queue (at the root) once it returns
    return channel


def declare(ch: BlockingChannel, prefix: str = "q", **arguments: Any) -> str:
    name = uid(prefix)
    ch.queue_declare(name, arguments=arguments or None)
    return name


def publish(ch: BlockingChannel, key: str, body: bytes, exchange: str = "", **props: Any) -> None:
    ch.basic_publish(exchange, key, body, pika.BasicProperties(**props) if props else None)


def depth(ch: BlockingChannel, name: str) -> int:
    return ch.queue_declare(name, passive=True).method.message_count


def get(
    ch: BlockingChannel, name: str, timeout: float = 10.0, auto_ack: bool = True
) -> tuple[Any, Any, bytes]:
    """basic.get until a message comes (a dead letter travels through the root)."""
    deadline = time.monotonic() + timeout
    while True:
        method, props, body = ch.basic_get(name, auto_ack=auto_ack)
        if method is not None:
            return method, props, body
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing arrived in {name}")
        time.sleep(0.05)


def recent(when: datetime.datetime) -> bool:
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    return abs((now - when.replace(tzinfo=None)).total_seconds()) < 120


def dead_letter_queue(ch: BlockingChannel) -> tuple[str, str]:
    """A fanout dead-letter exchange and the queue behind it."""
    exchange = uid("dlx")
    ch.exchange_declare(exchange, "fanout")
    dead = declare(ch, "dead")
    ch.queue_bind(dead, exchange)
    return exchange, dead


# -- message TTL --------------------------------------------------------------------------


def test_queue_message_ttl(ch: BlockingChannel) -> None:
    queue = declare(ch, **{"x-message-ttl": 300})
    for i in range(3):
        publish(ch, queue, b"%d" % i)
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert body == b"0" and method.message_count == 2
    eventually(lambda: depth(ch, queue) == 0)
    assert ch.basic_get(queue) == (None, None, None)


def test_an_expired_message_is_not_delivered_to_a_late_consumer(
    conn: BlockingConnection, ch: BlockingChannel
) -> None:
    queue = declare(ch, **{"x-message-ttl": 200})
    publish(ch, queue, b"stale")
    time.sleep(0.6)
    got: list[bytes] = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append(b), auto_ack=True)
    publish(ch, queue, b"fresh")
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not got:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.3)
    assert got == [b"fresh"]


def test_per_message_expiration(ch: BlockingChannel) -> None:
    queue = declare(ch)
    publish(ch, queue, b"short", expiration="200")
    publish(ch, queue, b"kept")
    time.sleep(0.5)
    # the head expired: it is gone before the get, and "kept" comes out
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert body == b"kept" and method.message_count == 0


@pytest.mark.parametrize(("queue_ttl", "expiration"), [(60_000, "200"), (200, "60000")])
def test_the_smaller_ttl_wins(ch: BlockingChannel, queue_ttl: int, expiration: str) -> None:
    queue = declare(ch, **{"x-message-ttl": queue_ttl})
    publish(ch, queue, b"m", expiration=expiration)
    assert depth(ch, queue) == 1
    eventually(lambda: depth(ch, queue) == 0, timeout=5)


def test_a_short_expiration_behind_a_long_one_waits_for_the_head(ch: BlockingChannel) -> None:
    queue = declare(ch)
    publish(ch, queue, b"long", expiration="60000")
    publish(ch, queue, b"short", expiration="100")
    time.sleep(0.5)
    assert depth(ch, queue) == 2  # RabbitMQ expires from the head only
    _method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert body == b"long"
    assert ch.basic_get(queue) == (None, None, None)  # expired on reaching the head


def test_an_invalid_expiration_closes_the_channel_with_406(conn: BlockingConnection) -> None:
    channel = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.basic_publish("", "anywhere", b"x", pika.BasicProperties(expiration="soon"))
        channel.queue_declare(uid("q"))  # the close arrives by the next sync method
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - invalid expiration 'soon': no_integer"


# -- x-expires ------------------------------------------------------------------------------


def test_x_expires_deletes_an_unused_queue(conn: BlockingConnection) -> None:
    channel = conn.channel()
    queue = uid("q")
    channel.queue_declare(queue, arguments={"x-expires": 400})
    deadline = time.monotonic() + 10
    with pytest.raises(ChannelClosedByBroker) as info:
        while time.monotonic() < deadline:
            channel.queue_declare(queue, passive=True)  # a use too: so not too often
            time.sleep(0.6)
    assert info.value.reply_code == 404


def test_x_expires_spares_a_queue_with_a_consumer(
    conn: BlockingConnection, ch: BlockingChannel
) -> None:
    queue = declare(ch, **{"x-expires": 300})
    tag = ch.basic_consume(queue, lambda *a: None)
    conn.process_data_events(time_limit=0.9)
    assert depth(ch, queue) == 0  # still there
    ch.basic_cancel(tag)
    time.sleep(1.0)
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(queue, passive=True)
    assert info.value.reply_code == 404


# -- dead-lettering ---------------------------------------------------------------------------


def test_rejected_messages_are_dead_lettered_with_rabbitmqs_x_death(ch: BlockingChannel) -> None:
    exchange, dead = dead_letter_queue(ch)
    queue = declare(ch, **{"x-dead-letter-exchange": exchange})
    publish(ch, queue, b"no", headers={"app": "kept"}, message_id="m1")
    method, _props, _body = ch.basic_get(queue)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get(ch, dead)
    assert body == b"no" and method.exchange == exchange and method.routing_key == queue
    assert props.message_id == "m1"
    headers = dict(props.headers)
    (death,) = headers.pop("x-death")
    assert recent(death.pop("time"))
    assert death == {
        "count": 1,
        "reason": "rejected",
        "queue": queue,
        "exchange": "",
        "routing-keys": [queue],
    }
    assert headers == {
        "app": "kept",
        "x-first-death-exchange": "",
        "x-first-death-queue": queue,
        "x-first-death-reason": "rejected",
    }


def test_nack_without_requeue_dead_letters_too(ch: BlockingChannel) -> None:
    exchange, dead = dead_letter_queue(ch)
    queue = declare(ch, **{"x-dead-letter-exchange": exchange})
    for body in (b"a", b"b"):
        publish(ch, queue, body)
    ch.basic_get(queue)
    method, _props, _body = ch.basic_get(queue)
    ch.basic_nack(method.delivery_tag, multiple=True, requeue=False)
    assert {get(ch, dead)[2], get(ch, dead)[2]} == {b"a", b"b"}


def test_expired_messages_are_dead_lettered_with_their_expiration_noted(
    ch: BlockingChannel,
) -> None:
    target = declare(ch, "retry")
    queue = declare(
        ch,
        **{
            "x-message-ttl": 60_000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": target,
        },
    )
    publish(ch, queue, b"late", expiration="100", correlation_id="c")
    method, props, body = get(ch, target)
    assert body == b"late" and method.routing_key == target and method.exchange == ""
    assert props.expiration is None  # removed from the dead-lettered copy
    assert props.correlation_id == "c"
    (death,) = props.headers["x-death"]
    assert recent(death.pop("time"))
    assert death == {
        "count": 1,
        "reason": "expired",
        "queue": queue,
        "exchange": "",
        "routing-keys": [queue],
        "original-expiration": "100",
    }


def test_drop_head_overflow_dead_letters_maxlen(ch: BlockingChannel) -> None:
    exchange, dead = dead_letter_queue(ch)
    queue = declare(ch, **{"x-max-length": 1, "x-dead-letter-exchange": exchange})
    publish(ch, queue, b"first")
    publish(ch, queue, b"second")
    _method, props, body = get(ch, dead)
    assert body == b"first"
    assert [(d["reason"], d["queue"], d["count"]) for d in props.headers["x-death"]] == [
        ("maxlen", queue, 1)
    ]
    assert props.headers["x-first-death-reason"] == "maxlen"
    assert depth(ch, queue) == 1


def test_max_length_bytes_drops_heads_until_the_bodies_fit(ch: BlockingChannel) -> None:
    exchange, dead = dead_letter_queue(ch)
    queue = declare(ch, **{"x-max-length-bytes": 10, "x-dead-letter-exchange": exchange})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        publish(ch, queue, body)
    assert depth(ch, queue) == 2
    publish(ch, queue, b"0123456789A")  # more than the limit alone: nothing fits
    assert depth(ch, queue) == 0
    eventually(lambda: depth(ch, dead) == 4)
    got = [get(ch, dead) for _ in range(4)]
    assert [body for _m, _p, body in got] == [b"aaaa", b"bbbb", b"cccc", b"0123456789A"]
    assert {props.headers["x-death"][0]["reason"] for _m, props, _b in got} == {"maxlen"}


def test_a_missing_dead_letter_exchange_drops_the_message(ch: BlockingChannel) -> None:
    queue = declare(ch, **{"x-dead-letter-exchange": uid("absent")})
    publish(ch, queue, b"gone")
    method, _props, _body = ch.basic_get(queue)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert depth(ch, queue) == 0
    assert ch.is_open


def test_a_message_rejected_in_a_loop_counts_its_deaths(ch: BlockingChannel) -> None:
    """A rejection is never a cycle: the message comes back, its count goes up."""
    queue = uid("q")
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue}
    ch.queue_declare(queue, arguments=args)
    publish(ch, queue, b"again")
    counts = []
    for _ in range(3):
        method, props, _body = get(ch, queue, auto_ack=False)
        assert method.redelivered is False  # a new message each time, not a redelivery
        counts.append(props.headers["x-death"][0]["count"] if props.headers else 0)
        ch.basic_reject(method.delivery_tag, requeue=False)
    _method, props, _body = get(ch, queue)
    (death,) = props.headers["x-death"]
    assert counts == [0, 1, 2]
    assert (death["count"], death["reason"], death["queue"]) == (3, "rejected", queue)


def test_an_automatic_cycle_is_dropped(ch: BlockingChannel) -> None:
    queue = uid("q")
    args = {
        "x-message-ttl": 100,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": queue,
    }
    ch.queue_declare(queue, arguments=args)
    publish(ch, queue, b"loop")
    time.sleep(0.5)
    assert depth(ch, queue) == 0  # expired into itself: dropped, not looping


def test_two_queues_expiring_into_each_other_go_round_once(ch: BlockingChannel) -> None:
    a, b = uid("a"), uid("b")
    for name, other in ((a, b), (b, a)):
        ch.queue_declare(
            name,
            arguments={
                "x-message-ttl": 150,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": other,
            },
        )
    publish(ch, a, b"m")
    time.sleep(1.0)
    assert depth(ch, a) == 0 and depth(ch, b) == 0


def test_x_death_raw_types_and_order(amqp_port: int, ch: BlockingChannel) -> None:
    """The header bytes: a long count, a timestamp time, the keys in RabbitMQ's order."""
    exchange, dead = dead_letter_queue(ch)
    queue = declare(ch, **{"x-dead-letter-exchange": exchange})
    publish(ch, queue, b"raw", headers={"z": 1, "a": "x"})
    method, _props, _body = ch.basic_get(queue)
    ch.basic_reject(method.delivery_tag, requeue=False)
    eventually(lambda: depth(ch, dead) == 1)
    entries = raw_headers(amqp_port, dead)
    assert [k for k, _ in entries] == [
        b"a",
        b"x-death",
        b"x-first-death-exchange",
        b"x-first-death-queue",
        b"x-first-death-reason",
        b"z",
    ]
    (death,) = tables.parse_array(dict(entries)[b"x-death"])
    fields = tables.parse_table(death, 1)
    assert [(k, v[:1]) for k, v in fields] == [
        (b"count", b"l"),
        (b"reason", b"S"),
        (b"queue", b"S"),
        (b"time", b"T"),
        (b"exchange", b"S"),
        (b"routing-keys", b"A"),
    ]


# -- requeue order ------------------------------------------------------------------------------


def test_nacked_messages_go_back_to_their_original_position(ch: BlockingChannel) -> None:
    queue = declare(ch)
    for i in range(1, 7):
        publish(ch, queue, b"%d" % i)
    tags = {}
    for _ in range(5):
        method, _props, body = ch.basic_get(queue)
        tags[body] = method.delivery_tag
    for body in (b"5", b"4", b"3", b"2"):  # one at a time, backwards
        ch.basic_nack(tags[body], requeue=True)
    ch.basic_ack(tags[b"1"])
    got = [ch.basic_get(queue, auto_ack=True) for _ in range(5)]
    assert [body for _m, _p, body in got] == [b"2", b"3", b"4", b"5", b"6"]
    assert [m.redelivered for m, _p, _b in got] == [True, True, True, True, False]


def test_a_closed_channels_unacked_go_back_in_order(conn: BlockingConnection) -> None:
    first = conn.channel()
    first.confirm_delivery()
    queue = declare(first)
    for i in range(1, 5):
        publish(first, queue, b"%d" % i)
    for _ in range(3):
        first.basic_get(queue)  # 1, 2, 3 unacked
    first.close()
    second = conn.channel()
    got = [second.basic_get(queue, auto_ack=True)[2] for _ in range(4)]
    assert got == [b"1", b"2", b"3", b"4"]


def raw_headers(port: int, queue: str) -> list[tables.Entry]:
    """The raw header table of the next message in ``queue`` (got with no-ack)."""
    client = Client(AMQPURL(f"amqp://guest:guest@127.0.0.1:{port}/")).connect()
    try:
        number = client.open_channel()
        client.rpc(number, commands.Basic.Get(queue=queue, no_ack=True), commands.Basic.GetOk)
        _type, _channel, payload = client._read_frame()
    finally:
        client.close()
    return tables.parse_table(tables.split_properties(payload[12:])[tables.HEADERS])


def test_a_repeated_death_only_counts_and_sorts_its_keys(
    amqp_port: int, ch: BlockingChannel
) -> None:
    queue = uid("q")
    ch.queue_declare(
        queue, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue}
    )
    publish(ch, queue, b"m")
    method, _props, _body = get(ch, queue, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, _body = get(ch, queue, auto_ack=False)
    first_time = props.headers["x-death"][0]["time"]
    time.sleep(1.2)  # a later death would show a later second
    ch.basic_reject(method.delivery_tag, requeue=False)
    eventually(lambda: depth(ch, queue) == 1)
    (death,) = tables.parse_array(dict(raw_headers(amqp_port, queue))[b"x-death"])
    fields = tables.parse_table(death, 1)
    assert [k for k, _ in fields] == [
        b"count",
        b"exchange",
        b"queue",
        b"reason",
        b"routing-keys",
        b"time",
    ]
    assert tables.int_of(dict(fields)[b"count"]) == 2
    when = int.from_bytes(dict(fields)[b"time"][1:], "big")
    assert when == int(first_time.replace(tzinfo=datetime.UTC).timestamp())


def test_deaths_in_three_queues_are_listed_as_rabbitmq_3_10_lists_them(
    ch: BlockingChannel,
) -> None:
    names = [uid("q1"), uid("q2"), uid("q3"), uid("end")]
    ch.queue_declare(names[3])
    for name, after in itertools.pairwise(names):
        ch.queue_declare(
            name, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": after}
        )
    publish(ch, names[0], b"m")
    for name in names[:3]:
        method, _props, _body = get(ch, name, auto_ack=False)
        ch.basic_reject(method.delivery_tag, requeue=False)
    _method, props, _body = get(ch, names[3])
    # 3.10 groups an existing list of two or more, which reverses it
    assert [d["queue"] for d in props.headers["x-death"]] == [names[2], names[0], names[1]]
    assert props.headers["x-first-death-queue"] == names[0]
