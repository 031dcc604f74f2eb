"""brokerd driven by pika's BlockingConnection, as a RabbitMQ application would.

Every name is unique per test, so the tests share one broker per module. Set
``ROOKERY_REFERENCE_AMQP_PORT=5672`` to run the same tests against a real
RabbitMQ on 127.0.0.1 (guest/guest) and compare.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import (
    ChannelClosedByBroker,
    NackError,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
    UnroutableError,
)

from tests.conftest import uid
from tests.support.eventually import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Delivery = tuple[pika.spec.Basic.Deliver, pika.BasicProperties, bytes]


def params(
    port: int,
    *,
    user: str = "guest",
    password: str = "guest",
    vhost: str = "/",
) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host="127.0.0.1",
        port=port,
        virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password),
        connection_attempts=1,
        socket_timeout=5,
        stack_timeout=10,
        blocked_connection_timeout=10,
    )


@pytest.fixture
def connect(amqp_port: int) -> Iterator[Callable[[], BlockingConnection]]:
    """Open any number of connections; all are closed after the test."""
    opened: list[BlockingConnection] = []

    def _connect() -> BlockingConnection:
        conn = BlockingConnection(params(amqp_port))
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        if conn.is_open:
            conn.close()


@pytest.fixture
def conn(connect: Callable[[], BlockingConnection]) -> BlockingConnection:
    return connect()


@pytest.fixture
def ch(conn: BlockingConnection) -> BlockingChannel:
    return conn.channel()


def declare_queue(ch: BlockingChannel, prefix: str = "q", **kwargs) -> str:
    name = uid(prefix)
    ch.queue_declare(name, **kwargs)
    return name


def queue_depth(ch: BlockingChannel, name: str) -> int:
    return ch.queue_declare(name, passive=True).method.message_count


def collect(conn: BlockingConnection, sink: list, want: int, timeout: float = 5.0) -> None:
    """Pump the connection until ``sink`` holds ``want`` items or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while len(sink) < want and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def settle(conn: BlockingConnection, seconds: float) -> None:
    """Pump the connection for a while (to see that nothing more arrives)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def publish(
    ch: BlockingChannel, routing_key: str, body: bytes, exchange: str = "", **props
) -> None:
    ch.basic_publish(exchange, routing_key, body, pika.BasicProperties(**props) if props else None)


# -- wiring, publish, get, consume --------------------------------------------------


def test_declare_bind_publish_get_round_trip(ch: BlockingChannel) -> None:
    exchange = uid("x")
    ch.exchange_declare(exchange, "direct")
    queue = declare_queue(ch)
    ch.queue_bind(queue, exchange, routing_key="rk")
    props = pika.BasicProperties(
        content_type="application/json",
        delivery_mode=2,
        headers={"a": 1, "b": "two", "nested": {"x": [1, 2]}},
        message_id="m-1",
        correlation_id="c-1",
        priority=3,
    )
    ch.basic_publish(exchange, "rk", b'{"n": 1}', props)
    ch.basic_publish(exchange, "other-key", b"not routed")
    method, got_props, body = ch.basic_get(queue)
    assert method is not None
    assert body == b'{"n": 1}'
    assert method.exchange == exchange
    assert method.routing_key == "rk"
    assert method.redelivered is False
    assert method.message_count == 0
    assert got_props.content_type == "application/json"
    assert got_props.delivery_mode == 2
    assert got_props.headers == {"a": 1, "b": "two", "nested": {"x": [1, 2]}}
    assert got_props.message_id == "m-1"
    assert got_props.correlation_id == "c-1"
    assert got_props.priority == 3
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get(queue) == (None, None, None)


def test_server_named_queue_and_default_exchange(ch: BlockingChannel) -> None:
    result = ch.queue_declare("", exclusive=True)
    name = result.method.queue
    assert name.startswith("amq.gen-")
    publish(ch, name, b"via default exchange")
    method, _props, body = ch.basic_get(name, auto_ack=True)
    assert body == b"via default exchange"
    assert method.exchange == ""


def test_large_message_spans_frames(ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    body = bytes(range(256)) * 2048  # 512 KiB: several frames at any frame_max
    publish(ch, queue, body)
    _method, _props, got = ch.basic_get(queue, auto_ack=True)
    assert got == body


def test_consume_and_ack(conn: BlockingConnection, ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    for i in range(5):
        publish(ch, queue, f"m{i}".encode())
    bodies = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=5):
        assert method is not None, "timed out waiting for a delivery"
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == 5:
            break
    ch.cancel()
    assert bodies == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert queue_depth(ch, queue) == 0


def test_basic_get_empty_and_message_count(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    queue = declare_queue(ch)
    assert ch.basic_get(queue) == (None, None, None)
    for i in range(3):
        publish(ch, queue, str(i).encode())
    assert queue_depth(ch, queue) == 3
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert body == b"0"
    assert method.message_count == 2


# -- acknowledgements -------------------------------------------------------------


def test_nack_requeue_sets_redelivered(ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    publish(ch, queue, b"again")
    first, _props, _body = ch.basic_get(queue)
    assert first.redelivered is False
    ch.basic_nack(first.delivery_tag, requeue=True)
    second, _props, body = ch.basic_get(queue)
    assert body == b"again"
    assert second.redelivered is True
    assert second.delivery_tag != first.delivery_tag
    ch.basic_ack(second.delivery_tag)
    assert queue_depth(ch, queue) == 0


def test_reject_requeue_redelivers_to_consumer(
    conn: BlockingConnection, ch: BlockingChannel
) -> None:
    queue = declare_queue(ch)
    publish(ch, queue, b"bounce")
    seen: list[tuple[bool, bytes]] = []

    def on_message(channel, method, _props, body) -> None:
        seen.append((method.redelivered, body))
        if len(seen) == 1:
            channel.basic_reject(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message)
    collect(conn, seen, 2)
    assert seen == [(False, b"bounce"), (True, b"bounce")]


def test_nack_multiple_requeues_all(ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    for i in range(3):
        publish(ch, queue, str(i).encode())
    tags = [ch.basic_get(queue)[0].delivery_tag for _ in range(3)]
    ch.basic_nack(tags[-1], multiple=True, requeue=True)
    again = [ch.basic_get(queue, auto_ack=True) for _ in range(3)]
    assert [body for _m, _p, body in again] == [b"0", b"1", b"2"]
    assert all(method.redelivered for method, _p, _b in again)


def test_reject_without_requeue_drops(ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    publish(ch, queue, b"gone")
    publish(ch, queue, b"kept")
    method, _props, body = ch.basic_get(queue)
    assert body == b"gone"
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, _props, body = ch.basic_get(queue)
    assert body == b"kept"
    ch.basic_nack(method.delivery_tag, requeue=False)
    assert ch.basic_get(queue) == (None, None, None)
    assert queue_depth(ch, queue) == 0


def test_unacked_messages_return_when_channel_closes(conn: BlockingConnection) -> None:
    ch = conn.channel()
    queue = declare_queue(ch)
    publish(ch, queue, b"unacked")
    method, _props, _body = ch.basic_get(queue)
    assert method is not None
    assert queue_depth(ch, queue) == 0
    ch.close()
    ch2 = conn.channel()
    method, _props, body = ch2.basic_get(queue, auto_ack=True)
    assert body == b"unacked"
    assert method.redelivered is True


def test_ack_unknown_tag_closes_only_the_channel(conn: BlockingConnection) -> None:
    bystander = conn.channel()
    queue = declare_queue(bystander)
    ch = conn.channel()
    ch.basic_ack(delivery_tag=999)
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(queue, passive=True)
    assert info.value.reply_code == 406
    assert "PRECONDITION_FAILED" in info.value.reply_text
    assert not ch.is_open
    assert conn.is_open
    # the other channel and new channels on the same connection still work
    publish(bystander, queue, b"still fine")
    assert bystander.basic_get(queue, auto_ack=True)[2] == b"still fine"
    fresh = conn.channel()
    assert queue_depth(fresh, queue) == 0


def test_basic_recover_requeues_with_redelivered(ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    publish(ch, queue, b"recover me")
    method, _props, _body = ch.basic_get(queue)
    assert method.redelivered is False
    ch.basic_recover(requeue=True)
    method, _props, body = ch.basic_get(queue)
    assert body == b"recover me"
    assert method.redelivered is True
    ch.basic_ack(method.delivery_tag)
    assert queue_depth(ch, queue) == 0


# -- publisher confirms and returns ---------------------------------------------------


def test_publisher_confirms_ack(ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    ch.confirm_delivery()
    for i in range(20):
        publish(ch, queue, str(i).encode())  # raises NackError / UnroutableError otherwise
    assert queue_depth(ch, queue) == 20


def test_publisher_confirm_nack_when_queue_rejects(ch: BlockingChannel) -> None:
    queue = declare_queue(ch, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    publish(ch, queue, b"1")
    publish(ch, queue, b"2")
    with pytest.raises(NackError):
        publish(ch, queue, b"3")
    assert ch.is_open
    assert queue_depth(ch, queue) == 2
    # room again once a message is consumed
    ch.basic_get(queue, auto_ack=True)
    publish(ch, queue, b"4")
    bodies = [ch.basic_get(queue, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"2", b"4"]


def test_max_length_drop_head_without_overflow_setting(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    queue = declare_queue(ch, arguments={"x-max-length": 2})
    for body in (b"1", b"2", b"3"):
        publish(ch, queue, body)
    assert queue_depth(ch, queue) == 2
    assert [ch.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"2", b"3"]


def test_mandatory_unroutable_with_confirms_raises(ch: BlockingChannel) -> None:
    exchange = uid("x")
    ch.exchange_declare(exchange, "direct")
    ch.confirm_delivery()
    with pytest.raises(UnroutableError) as info:
        ch.basic_publish(exchange, "nowhere", b"lost", mandatory=True)
    returned = info.value.messages
    assert len(returned) == 1
    assert returned[0].method.reply_code == 312
    assert returned[0].method.reply_text == "NO_ROUTE"
    assert returned[0].method.exchange == exchange
    assert returned[0].method.routing_key == "nowhere"
    assert returned[0].body == b"lost"
    # not mandatory: silently dropped, confirmed
    ch.basic_publish(exchange, "nowhere", b"dropped", mandatory=False)
    assert ch.is_open


def test_mandatory_return_without_confirms(conn: BlockingConnection, ch: BlockingChannel) -> None:
    returns: list[tuple[int, str, bytes]] = []
    ch.add_on_return_callback(
        lambda _ch, method, _props, body: returns.append(
            (method.reply_code, method.routing_key, body)
        )
    )
    ch.basic_publish("", uid("no-such-queue"), b"bounced", mandatory=True)
    collect(conn, returns, 1)
    assert len(returns) == 1
    code, _key, body = returns[0]
    assert code == 312
    assert body == b"bounced"


# -- errors: 404 / 405 / 406 -----------------------------------------------------------


def test_exclusive_queue_is_locked_for_other_connections(
    connect: Callable[[], BlockingConnection],
) -> None:
    owner = connect()
    owner_ch = owner.channel()
    queue = declare_queue(owner_ch, exclusive=True)
    publish(owner_ch, queue, b"mine")

    other = connect()
    for attempt in (
        lambda c: c.queue_declare(queue, exclusive=True),
        lambda c: c.queue_declare(queue),
        lambda c: c.queue_declare(queue, passive=True),
        lambda c: c.basic_consume(queue, lambda *a: None),
        lambda c: c.basic_get(queue),
        lambda c: c.queue_purge(queue),
        lambda c: c.queue_delete(queue),
    ):
        c = other.channel()
        with pytest.raises(ChannelClosedByBroker) as info:
            attempt(c)
        assert info.value.reply_code == 405
        assert "RESOURCE_LOCKED" in info.value.reply_text
    assert other.is_open
    # the owner is not disturbed
    assert owner_ch.basic_get(queue, auto_ack=True)[2] == b"mine"
    # the exclusive queue goes with its connection
    owner.close()
    c = other.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        c.queue_declare(queue, passive=True)
    assert info.value.reply_code == 404


def test_passive_declare_missing_queue_is_404(conn: BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(uid("missing"), passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text.startswith("NOT_FOUND - no queue")
    assert conn.is_open


def test_passive_declare_missing_exchange_is_404(conn: BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare(uid("missing"), passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text.startswith("NOT_FOUND - no exchange")
    # an existing one passes
    ch = conn.channel()
    ch.exchange_declare("amq.topic", passive=True)


def test_publish_to_missing_exchange_is_404(conn: BlockingConnection) -> None:
    ch = conn.channel()
    ch.basic_publish(uid("missing"), "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("", exclusive=True)
    assert info.value.reply_code == 404


def test_bind_to_missing_queue_is_404(conn: BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_bind(uid("missing"), "amq.direct", "k")
    assert info.value.reply_code == 404


def test_redeclare_with_different_flags_is_406(conn: BlockingConnection) -> None:
    ch = conn.channel()
    queue = declare_queue(ch, durable=False)
    ch.queue_declare(queue, durable=False)  # same flags: fine
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(queue, durable=True)
    assert info.value.reply_code == 406
    assert "inequivalent arg 'durable'" in info.value.reply_text

    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(queue, arguments={"x-max-length": 5})
    assert info.value.reply_code == 406

    ch = conn.channel()
    exchange = uid("x")
    ch.exchange_declare(exchange, "direct")
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare(exchange, "topic")
    assert info.value.reply_code == 406
    assert "inequivalent arg 'type'" in info.value.reply_text

    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare(exchange, "direct", durable=True)
    assert info.value.reply_code == 406
    assert conn.is_open


def test_redeclare_exclusive_mismatch_is_405_even_for_the_owner(conn: BlockingConnection) -> None:
    ch = conn.channel()
    exclusive = declare_queue(ch, exclusive=True)
    shared = declare_queue(ch)
    for name, flag in ((exclusive, False), (shared, True)):
        c = conn.channel()
        with pytest.raises(ChannelClosedByBroker) as info:
            c.queue_declare(name, exclusive=flag)
        assert info.value.reply_code == 405
    conn.channel().queue_declare(shared, passive=True, exclusive=True)  # passive ignores flags


def test_redeclare_compares_only_known_arguments(conn: BlockingConnection) -> None:
    ch = conn.channel()
    queue = declare_queue(ch, arguments={"x-max-length": 3, "x-custom": "a"})
    ch.queue_declare(
        queue, arguments={"x-max-length": 3, "x-custom": "b", "x-queue-type": "classic"}
    )
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(queue)
    assert info.value.reply_code == 406
    assert info.value.reply_text.endswith(
        f"inequivalent arg 'x-max-length' for queue '{queue}' in vhost '/': "
        "received none but current is the value '3' of type 'signedint'"
    )


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-message-ttl": "soon"}, '"expected integer, got longstr"'),
        ({"x-overflow": "bogus"}, "invalid_overflow"),
        ({"x-dead-letter-routing-key": "rk"}, "routing_key_but_no_dlx_defined"),
    ],
)
def test_invalid_queue_arguments_are_406(
    conn: BlockingConnection, arguments: dict, detail: str
) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(uid("bad-args"), arguments=arguments)
    assert info.value.reply_code == 406
    assert info.value.reply_text.endswith(detail)
    assert conn.is_open


def test_default_exchange_cannot_be_declared_or_deleted(conn: BlockingConnection) -> None:
    for attempt in (
        lambda c: c.exchange_declare("", passive=True),
        lambda c: c.exchange_delete(""),
        lambda c: c.queue_bind(declare_queue(c), ""),
    ):
        c = conn.channel()
        with pytest.raises(ChannelClosedByBroker) as info:
            attempt(c)
        assert info.value.reply_code == 403
        assert "default exchange" in info.value.reply_text
    c = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        c.exchange_delete("amq.direct")
    assert info.value.reply_code == 403


def test_reserved_names_are_refused(conn: BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare("amq." + uid("x"), "direct")
    assert info.value.reply_code == 403
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("amq." + uid("q"))
    assert info.value.reply_code == 403


# -- flow control and dispatch ------------------------------------------------------------


def test_prefetch_limits_unacked_in_flight(conn: BlockingConnection, ch: BlockingChannel) -> None:
    queue = declare_queue(ch)
    for i in range(10):
        publish(ch, queue, str(i).encode())
    ch.basic_qos(prefetch_count=3)
    got: list[tuple[int, bytes]] = []
    ch.basic_consume(queue, lambda _c, m, _p, body: got.append((m.delivery_tag, body)))
    collect(conn, got, 3)
    settle(conn, 0.5)
    assert [body for _t, body in got] == [b"0", b"1", b"2"]
    assert ch.queue_declare(queue, passive=True).method.message_count == 7

    ch.basic_ack(got[0][0])  # one credit -> exactly one more
    collect(conn, got, 4)
    settle(conn, 0.3)
    assert len(got) == 4
    assert got[3][1] == b"3"

    ch.basic_ack(got[-1][0], multiple=True)  # three credits -> three more
    collect(conn, got, 7)
    settle(conn, 0.3)
    assert len(got) == 7

    deadline = time.monotonic() + 5
    while len(got) < 10 and time.monotonic() < deadline:
        ch.basic_ack(got[-1][0], multiple=True)
        collect(conn, got, len(got) + 1, timeout=1)
    assert [body for _t, body in got] == [str(i).encode() for i in range(10)]


def test_round_robin_between_two_consumers(conn: BlockingConnection) -> None:
    ch1, ch2, pub = conn.channel(), conn.channel(), conn.channel()
    queue = declare_queue(pub)
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    ch1.basic_consume(queue, lambda _c, _m, _p, body: got["a"].append(body), auto_ack=True)
    ch2.basic_consume(queue, lambda _c, _m, _p, body: got["b"].append(body), auto_ack=True)
    for i in range(10):
        publish(pub, queue, str(i).encode())
    deadline = time.monotonic() + 5
    while len(got["a"]) + len(got["b"]) < 10 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert len(got["a"]) == 5
    assert len(got["b"]) == 5
    assert sorted(got["a"] + got["b"]) == sorted(str(i).encode() for i in range(10))


def test_channel_flow_pauses_delivery(conn: BlockingConnection, ch: BlockingChannel) -> None:
    """channel.flow from the client (DESIGN section 2; RabbitMQ itself answers 540)."""
    if os.environ.get("ROOKERY_REFERENCE_AMQP_PORT"):
        pytest.skip("RabbitMQ does not implement client-sent channel.flow active=false")
    queue = declare_queue(ch)
    got: list[bytes] = []
    ch.basic_consume(queue, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    assert ch.flow(False) is False
    publish(conn.channel(), queue, b"held")
    settle(conn, 0.3)
    assert got == []
    assert ch.flow(True) is True
    collect(conn, got, 1)
    assert got == [b"held"]


def test_exclusive_consumer_refuses_a_second(conn: BlockingConnection) -> None:
    ch = conn.channel()
    queue = declare_queue(ch)
    ch.basic_consume(queue, lambda *a: None, exclusive=True)
    other = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        other.basic_consume(queue, lambda *a: None)
    assert info.value.reply_code == 403


# -- exchange types -----------------------------------------------------------------


def bind_queues(ch: BlockingChannel, exchange: str, keys: dict[str, list[str]]) -> dict[str, str]:
    """Declare one queue per label and bind it with each of its keys."""
    names = {}
    for label, routing_keys in keys.items():
        names[label] = declare_queue(ch, label)
        for key in routing_keys:
            ch.queue_bind(names[label], exchange, routing_key=key)
    return names


def drain(ch: BlockingChannel, queue: str) -> list[bytes]:
    bodies = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def test_topic_exchange_routing(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    exchange = uid("topic")
    ch.exchange_declare(exchange, "topic")
    queues = bind_queues(
        ch,
        exchange,
        {"star": ["stock.*.nyse"], "hash": ["stock.#"], "tail": ["#.eur"], "all": ["#"]},
    )
    for key in ("stock.ibm.nyse", "stock.ibm", "stock.sap.xetra.eur", "bond.eur", "stock"):
        ch.basic_publish(exchange, key, key.encode())
    assert drain(ch, queues["star"]) == [b"stock.ibm.nyse"]
    assert drain(ch, queues["hash"]) == [
        b"stock.ibm.nyse",
        b"stock.ibm",
        b"stock.sap.xetra.eur",
        b"stock",
    ]
    assert drain(ch, queues["tail"]) == [b"stock.sap.xetra.eur", b"bond.eur"]
    assert len(drain(ch, queues["all"])) == 5


def test_fanout_exchange_routing(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    exchange = uid("fanout")
    ch.exchange_declare(exchange, "fanout")
    queues = bind_queues(ch, exchange, {"a": ["ignored"], "b": [""], "c": []})
    ch.basic_publish(exchange, "any-key", b"to everyone")
    assert drain(ch, queues["a"]) == [b"to everyone"]
    assert drain(ch, queues["b"]) == [b"to everyone"]
    assert drain(ch, queues["c"]) == []


def test_headers_exchange_routing(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    exchange = uid("headers")
    ch.exchange_declare(exchange, "headers")
    q_all = declare_queue(ch, "all")
    q_any = declare_queue(ch, "any")
    ch.queue_bind(q_all, exchange, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(q_any, exchange, arguments={"x-match": "any", "format": "pdf", "type": "report"})
    cases = [
        ({"format": "pdf", "type": "report"}, b"both"),
        ({"format": "pdf", "type": "log"}, b"one"),
        ({"format": "zip"}, b"none"),
        ({}, b"empty"),
    ]
    for headers, body in cases:
        publish(ch, "ignored", body, exchange=exchange, headers=headers)
    assert drain(ch, q_all) == [b"both"]
    assert drain(ch, q_any) == [b"both", b"one"]


def test_predeclared_exchanges(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        ch.exchange_declare(name, passive=True)
    queue = declare_queue(ch)
    ch.queue_bind(queue, "amq.topic", "a.#")
    ch.basic_publish("amq.topic", "a.b.c", b"via amq.topic")
    assert drain(ch, queue) == [b"via amq.topic"]


def test_exchange_to_exchange_binding(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    source = uid("src")
    middle = uid("mid")
    ch.exchange_declare(source, "topic")
    ch.exchange_declare(middle, "fanout")
    ch.exchange_bind(destination=middle, source=source, routing_key="orders.#")
    queue = declare_queue(ch)
    ch.queue_bind(queue, middle)
    ch.basic_publish(source, "orders.new", b"routed twice")
    ch.basic_publish(source, "invoices.new", b"not for us")
    assert drain(ch, queue) == [b"routed twice"]
    ch.exchange_unbind(destination=middle, source=source, routing_key="orders.#")
    ch.basic_publish(source, "orders.new", b"after unbind")
    assert drain(ch, queue) == []


def test_queue_unbind_stops_routing(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    queue = declare_queue(ch)
    ch.queue_bind(queue, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"1")
    ch.queue_unbind(queue, "amq.direct", "k")
    ch.basic_publish("amq.direct", "k", b"2")
    assert drain(ch, queue) == [b"1"]


# -- purge, delete, server-sent cancel ------------------------------------------------------


def test_queue_purge(ch: BlockingChannel) -> None:
    ch.confirm_delivery()  # depth checks below must not race the publishes
    queue = declare_queue(ch)
    for i in range(4):
        publish(ch, queue, str(i).encode())
    assert ch.queue_purge(queue).method.message_count == 4
    assert queue_depth(ch, queue) == 0
    assert ch.queue_purge(queue).method.message_count == 0


def test_queue_delete_if_empty_and_if_unused(conn: BlockingConnection) -> None:
    ch = conn.channel()
    queue = declare_queue(ch)
    publish(ch, queue, b"x")
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_delete(queue, if_empty=True)
    assert info.value.reply_code == 406

    ch = conn.channel()
    ch.basic_consume(queue, lambda *a: None)
    other = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        other.queue_delete(queue, if_unused=True)
    assert info.value.reply_code == 406

    other = conn.channel()
    assert queue_depth(other, queue) == 0  # the consumer holds the message now
    ch.close()  # consumer gone, message requeued
    other.queue_declare(queue, passive=True)
    assert other.queue_delete(queue, if_unused=True).method.message_count == 1
    with pytest.raises(ChannelClosedByBroker) as info:
        other.queue_declare(queue, passive=True)
    assert info.value.reply_code == 404


def test_exchange_delete_if_unused(conn: BlockingConnection) -> None:
    ch = conn.channel()
    exchange = uid("x")
    ch.exchange_declare(exchange, "direct")
    queue = declare_queue(ch)
    ch.queue_bind(queue, exchange, "k")
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_delete(exchange, if_unused=True)
    assert info.value.reply_code == 406
    ch = conn.channel()
    ch.queue_unbind(queue, exchange, "k")
    ch.exchange_delete(exchange, if_unused=True)
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare(exchange, passive=True)
    assert info.value.reply_code == 404


def test_server_cancels_consumer_when_queue_deleted(
    connect: Callable[[], BlockingConnection],
) -> None:
    conn = connect()
    ch = conn.channel()
    queue = declare_queue(ch)
    cancels: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancels.append(frame.method.consumer_tag))
    tag = ch.basic_consume(queue, lambda *a: None)
    assert ch.consumer_tags == [tag]

    admin = connect().channel()
    admin.queue_delete(queue)
    collect(conn, cancels, 1)
    assert cancels == [tag]
    assert ch.consumer_tags == []
    assert ch.is_open


def test_auto_delete_queue_goes_with_last_consumer(conn: BlockingConnection) -> None:
    ch = conn.channel()
    queue = declare_queue(ch, auto_delete=True)
    tag = ch.basic_consume(queue, lambda *a: None)
    ch.basic_cancel(tag)
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(queue, passive=True)
    assert info.value.reply_code == 404


# -- expiry and dead-lettering ------------------------------------------------------------


def death_summary(headers: dict) -> list[tuple[str, str, int, list[str]]]:
    return [
        (d["reason"], d["queue"], d["count"], list(d["routing-keys"])) for d in headers["x-death"]
    ]


def test_queue_message_ttl_expires_messages(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    queue = declare_queue(ch, arguments={"x-message-ttl": 100})
    publish(ch, queue, b"short-lived")
    time.sleep(0.4)
    assert ch.basic_get(queue) == (None, None, None)


def test_per_message_expiration(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    queue = declare_queue(ch)
    publish(ch, queue, b"short-lived", expiration="100")
    publish(ch, queue, b"forever")
    time.sleep(0.4)
    assert drain(ch, queue) == [b"forever"]


def test_dead_letter_on_reject(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    dlx = uid("dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = declare_queue(ch, "dead")
    ch.queue_bind(dead, dlx)
    queue = declare_queue(ch, arguments={"x-dead-letter-exchange": dlx})
    publish(ch, queue, b"unwanted", headers={"mine": 1})
    method, _props, _body = ch.basic_get(queue)
    ch.basic_reject(method.delivery_tag, requeue=False)
    deadline = time.monotonic() + 1
    method = None
    while method is None and time.monotonic() < deadline:
        method, props, body = ch.basic_get(dead, auto_ack=True)
    assert method is not None
    assert body == b"unwanted"
    assert method.exchange == dlx
    assert method.routing_key == queue
    assert props.headers["mine"] == 1
    assert death_summary(props.headers) == [("rejected", queue, 1, [queue])]
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-queue"] == queue


def test_dead_letter_on_expiry_with_routing_key(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    dlx = uid("dlx")
    ch.exchange_declare(dlx, "direct")
    dead = declare_queue(ch, "dead")
    ch.queue_bind(dead, dlx, "expired")
    queue = declare_queue(
        ch,
        arguments={
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-routing-key": "expired",
            "x-message-ttl": 50,
        },
    )
    publish(ch, queue, b"too late")
    method, props, body = eventually(
        lambda: (got := ch.basic_get(dead, auto_ack=True))[0] and got, 5, "the dead letter"
    )
    assert body == b"too late"
    assert method.routing_key == "expired"
    assert death_summary(props.headers) == [("expired", queue, 1, [queue])]


def test_dead_letter_on_max_length(ch: BlockingChannel) -> None:
    ch.confirm_delivery()
    dlx = uid("dlx")
    ch.exchange_declare(dlx, "fanout")
    dead = declare_queue(ch, "dead")
    ch.queue_bind(dead, dlx)
    queue = declare_queue(ch, arguments={"x-dead-letter-exchange": dlx, "x-max-length": 1})
    publish(ch, queue, b"pushed out")
    publish(ch, queue, b"kept")
    time.sleep(0.1)
    _method, props, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"pushed out"
    assert death_summary(props.headers)[0][0] == "maxlen"
    assert drain(ch, queue) == [b"kept"]


def test_unused_queue_expires(conn: BlockingConnection) -> None:
    ch = conn.channel()
    queue = declare_queue(ch, arguments={"x-expires": 200})
    time.sleep(0.7)
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(queue, passive=True)
    assert info.value.reply_code == 404


# -- transactions ---------------------------------------------------------------------


def test_tx_commit_and_rollback(conn: BlockingConnection) -> None:
    ch = conn.channel()
    observer = conn.channel()
    queue = declare_queue(ch)
    ch.tx_select()
    publish(ch, queue, b"rolled back")
    assert queue_depth(observer, queue) == 0
    ch.tx_rollback()
    assert queue_depth(observer, queue) == 0

    publish(ch, queue, b"committed-1")
    publish(ch, queue, b"committed-2")
    assert queue_depth(observer, queue) == 0
    ch.tx_commit()
    assert queue_depth(observer, queue) == 2

    # acks are transactional too
    method, _props, _body = ch.basic_get(queue)
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    assert drain(observer, queue) == [b"committed-2"]


def test_tx_commit_without_select_is_406(conn: BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.tx_commit()
    assert info.value.reply_code == 406
    assert conn.is_open


# -- connection-level refusals ---------------------------------------------------------


def test_wrong_password_is_refused(amqp_port: int) -> None:
    with pytest.raises(ProbableAuthenticationError) as info:
        BlockingConnection(params(amqp_port, password="not-the-password"))
    assert "403" in str(info.value)
    assert "ACCESS_REFUSED" in str(info.value)


def test_unknown_user_is_refused(amqp_port: int) -> None:
    with pytest.raises(ProbableAuthenticationError):
        BlockingConnection(params(amqp_port, user=uid("nobody"), password="x"))


def test_unknown_vhost_is_refused_with_530(amqp_port: int) -> None:
    with pytest.raises(ProbableAccessDeniedError) as info:
        BlockingConnection(params(amqp_port, vhost=uid("no-such-vhost")))
    assert "530" in str(info.value)
    assert "NOT_ALLOWED" in str(info.value)


def test_server_properties_advertise_rabbitmq_capabilities(conn: BlockingConnection) -> None:
    caps = conn._impl.server_capabilities
    for name in (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ):
        assert caps.get(name) is True, name
    assert conn.consumer_cancel_notify_supported
    assert conn.publisher_confirms_supported
    assert conn.exchange_exchange_bindings_supported
    assert conn.basic_nack_supported
