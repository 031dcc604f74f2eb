"""The sans-IO Connection state machine, driven with pamqp-encoded frames and a fake clock."""

from __future__ import annotations

import struct

import pytest
from pamqp import body as pbody
from pamqp import commands, encode, frame
from pamqp import header as pheader
from pamqp.heartbeat import Heartbeat

from brokerd.config import default_config
from brokerd.model.broker import Broker
from brokerd.protocol.connection import Connection, ConnectionState
from brokerd.wire.codec import HEARTBEAT_FRAME, PROTOCOL_HEADER

LOOPBACK = ("127.0.0.1", 1)
REMOTE = ("10.0.0.5", 1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_broker() -> Broker:
    config = default_config()
    return Broker(config.user_database(), config.vhosts, config.limits)


def parse(data: bytes) -> list[tuple[int, object]]:
    out = []
    while data:
        consumed, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[consumed:]
    return out


def start_ok(user: str = "guest", password: str = "guest", caps: dict | None = None):
    caps = {"authentication_failure_close": True} if caps is None else caps
    return commands.Connection.StartOk(
        client_properties={"product": "unit-test", "capabilities": caps},
        mechanism="PLAIN",
        response=f"\0{user}\0{password}",
    )


def publish_frames(
    channel: int,
    exchange: str,
    key: str,
    body: bytes,
    frame_max: int = 4096,
    props: commands.Basic.Properties | None = None,
) -> bytes:
    props = props or commands.Basic.Properties()
    out = frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), channel)
    out += frame.marshal(pheader.ContentHeader(0, len(body), props), channel)
    step = frame_max - 8
    for i in range(0, len(body), step):
        out += frame.marshal(pbody.ContentBody(body[i : i + step]), channel)
    return out


class Client:
    """A pretend client: feeds encoded frames to a Connection and parses its replies."""

    def __init__(self, peer: tuple[str, int] = LOOPBACK, broker: Broker | None = None) -> None:
        self.clock = FakeClock()
        self.broker = broker or make_broker()
        self.conn = Connection(self.broker, peer, clock=self.clock)

    def feed(self, data: bytes) -> list[tuple[int, object]]:
        self.conn.receive_data(data)
        return self.replies()

    def send(self, channel: int, *methods) -> list[tuple[int, object]]:
        return self.feed(b"".join(frame.marshal(m, channel) for m in methods))

    def replies(self) -> list[tuple[int, object]]:
        return parse(self.conn.data_to_send())

    def handshake(self, heartbeat: int = 0, frame_max: int = 131072) -> None:
        out = self.feed(PROTOCOL_HEADER)
        assert isinstance(out[0][1], commands.Connection.Start)
        out = self.send(0, start_ok())
        assert isinstance(out[0][1], commands.Connection.Tune)
        assert self.send(0, commands.Connection.TuneOk(2047, frame_max, heartbeat)) == []
        out = self.send(0, commands.Connection.Open("/"))
        assert [type(m) for _, m in out] == [commands.Connection.OpenOk]
        assert self.conn.state is ConnectionState.OPEN

    def open_channel(self, number: int = 1) -> None:
        out = self.send(number, commands.Channel.Open())
        assert [(c, type(m)) for c, m in out] == [(number, commands.Channel.OpenOk)]

    def expect_connection_close(self, out, code: int) -> commands.Connection.Close:
        closes = [m for c, m in out if isinstance(m, commands.Connection.Close)]
        assert closes, f"expected connection.close {code}, got {out}"
        assert closes[-1].reply_code == code, closes[-1].reply_text
        assert self.conn.state in (ConnectionState.CLOSING, ConnectionState.CLOSED)
        return closes[-1]


@pytest.fixture
def amqp() -> Client:
    """A Client past the handshake (not pytest-django's ``client``)."""
    c = Client()
    c.handshake()
    return c


# -- the handshake ----------------------------------------------------------------------


def test_full_handshake_step_by_step():
    c = Client()
    out = c.feed(PROTOCOL_HEADER)
    assert len(out) == 1
    channel, start = out[0]
    assert channel == 0 and isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert set(start.mechanisms.split()) >= {"PLAIN", "AMQPLAIN"}
    caps = start.server_properties["capabilities"]
    for cap in (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "per_consumer_qos",
        "authentication_failure_close",
    ):
        assert caps[cap] is True, cap

    out = c.send(0, start_ok())
    assert [type(m) for _, m in out] == [commands.Connection.Tune]
    tune = out[0][1]
    limits = c.broker.limits
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (
        limits.channel_max,
        limits.frame_max,
        limits.heartbeat,
    )
    assert c.conn.state is ConnectionState.AWAIT_TUNE_OK

    assert c.send(0, commands.Connection.TuneOk(100, 8192, 0)) == []
    assert (c.conn.channel_max, c.conn.frame_max, c.conn.heartbeat) == (100, 8192, 0)
    out = c.send(0, commands.Connection.Open("/"))
    assert [type(m) for _, m in out] == [commands.Connection.OpenOk]
    assert c.conn.state is ConnectionState.OPEN
    assert c.conn.user.name == "guest" and c.conn.vhost.name == "/"


def client_stream() -> bytes:
    return PROTOCOL_HEADER + b"".join(
        frame.marshal(m, ch)
        for ch, m in [
            (0, start_ok()),
            (0, commands.Connection.TuneOk(2047, 131072, 0)),
            (0, commands.Connection.Open("/")),
            (1, commands.Channel.Open()),
            (1, commands.Queue.Declare(queue="pipelined")),
        ]
    )


def test_pipelined_handshake_in_one_write():
    c = Client()
    out = c.feed(client_stream())
    assert [type(m) for _, m in out] == [
        commands.Connection.Start,
        commands.Connection.Tune,
        commands.Connection.OpenOk,
        commands.Channel.OpenOk,
        commands.Queue.DeclareOk,
    ]


def test_handshake_fed_one_byte_at_a_time():
    c = Client()
    out = []
    for byte in client_stream():
        out += c.feed(bytes((byte,)))
    assert [type(m) for _, m in out][-1] is commands.Queue.DeclareOk
    assert c.conn.state is ConnectionState.OPEN


def test_amqplain_login():
    c = Client()
    c.feed(PROTOCOL_HEADER)
    # AMQPLAIN's response is a field table without its length prefix
    response = encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
    method = commands.Connection.StartOk(
        client_properties={}, mechanism="AMQPLAIN", response=response.decode("latin-1")
    )
    out = c.send(0, method)
    assert [type(m) for _, m in out] == [commands.Connection.Tune]


def test_full_session_publish_consume_deliver(amqp):
    amqp.open_channel(1)
    out = amqp.send(1, commands.Queue.Declare(queue="work"))
    assert isinstance(out[0][1], commands.Queue.DeclareOk)
    assert (out[0][1].queue, out[0][1].message_count, out[0][1].consumer_count) == ("work", 0, 0)

    body = bytes(range(256)) * 100  # 25600 bytes: several body frames at frame_max 4096
    props = commands.Basic.Properties(
        content_type="application/octet-stream",
        headers={"k": "v"},
        delivery_mode=2,
        message_id="m1",
    )
    assert amqp.feed(publish_frames(1, "", "work", body, 4096, props)) == []
    out = amqp.send(1, commands.Queue.Declare(queue="work", passive=True))
    assert out[0][1].message_count == 1

    out = amqp.send(1, commands.Basic.Consume(queue="work", consumer_tag="ctag"))
    kinds = [type(m) for _, m in out]
    assert kinds[:3] == [commands.Basic.ConsumeOk, commands.Basic.Deliver, pheader.ContentHeader]
    assert all(k is pbody.ContentBody for k in kinds[3:])
    deliver = out[1][1]
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("ctag", 1, False)
    assert (deliver.exchange, deliver.routing_key) == ("", "work")
    head = out[2][1]
    assert head.body_size == len(body)
    assert head.properties.content_type == "application/octet-stream"
    assert head.properties.headers == {"k": "v"}
    assert head.properties.message_id == "m1"
    assert b"".join(m.value for _, m in out[3:]) == body
    assert all(c == 1 for c, _ in out)

    # a live delivery straight from publish
    out = amqp.feed(publish_frames(1, "", "work", b"second"))
    assert [type(m) for _, m in out] == [
        commands.Basic.Deliver,
        pheader.ContentHeader,
        pbody.ContentBody,
    ]
    assert out[0][1].delivery_tag == 2 and out[2][1].value == b"second"

    assert amqp.send(1, commands.Basic.Ack(delivery_tag=2, multiple=True)) == []
    assert amqp.conn.channels[1].unacked_count == 0
    out = amqp.send(1, commands.Basic.Cancel(consumer_tag="ctag"))
    assert [type(m) for _, m in out] == [commands.Basic.CancelOk]
    out = amqp.send(1, commands.Channel.Close(200, "bye", 0, 0))
    assert [type(m) for _, m in out] == [commands.Channel.CloseOk]
    out = amqp.send(0, commands.Connection.Close(200, "bye", 0, 0))
    assert [type(m) for _, m in out] == [commands.Connection.CloseOk]
    assert amqp.conn.closed


def test_publisher_confirms_and_get(amqp):
    amqp.open_channel(1)
    amqp.send(1, commands.Queue.Declare(queue="q"))
    out = amqp.send(1, commands.Confirm.Select())
    assert [type(m) for _, m in out] == [commands.Confirm.SelectOk]
    out = amqp.feed(publish_frames(1, "", "q", b"a") + publish_frames(1, "", "q", b"b"))
    assert [type(m) for _, m in out] == [commands.Basic.Ack]
    assert (out[0][1].delivery_tag, out[0][1].multiple) == (2, True)
    out = amqp.send(1, commands.Basic.Get(queue="q", no_ack=True))
    assert isinstance(out[0][1], commands.Basic.GetOk)
    assert out[0][1].message_count == 1 and out[2][1].value == b"a"


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x09\x00",
        b"AMQP\x01\x01\x00\x09",
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x01\x00\x00\x00",
    ],
)
def test_wrong_protocol_header_gets_ours_back_and_closed(header):
    c = Client()
    c.conn.receive_data(header)
    assert c.conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert c.conn.closed
    c.conn.receive_data(PROTOCOL_HEADER)  # nothing more once closed
    assert c.conn.data_to_send() == b""


def test_partial_good_header_waits():
    c = Client()
    c.conn.receive_data(b"AMQ")
    assert c.conn.data_to_send() == b""
    assert not c.conn.closed
    out = c.feed(b"P\x00\x00\x09\x01")
    assert isinstance(out[0][1], commands.Connection.Start)


def test_guest_from_non_loopback_is_refused():
    c = Client(REMOTE)
    c.feed(PROTOCOL_HEADER)
    out = c.send(0, start_ok())
    close = c.expect_connection_close(out, 403)
    assert "ACCESS_REFUSED" in close.reply_text
    assert c.conn.closed
    assert c.conn.user is None


def test_guest_from_non_loopback_without_failure_close_capability():
    c = Client(REMOTE)
    c.feed(PROTOCOL_HEADER)
    out = c.send(0, start_ok(caps={}))
    assert not any(isinstance(m, commands.Connection.Tune) for _, m in out)
    assert c.conn.closed


def test_wrong_password_is_refused():
    c = Client()
    c.feed(PROTOCOL_HEADER)
    c.expect_connection_close(c.send(0, start_ok(password="nope")), 403)
    assert c.conn.closed


def test_unsupported_mechanism_is_refused():
    c = Client()
    c.feed(PROTOCOL_HEADER)
    out = c.send(
        0, commands.Connection.StartOk(client_properties={}, mechanism="EXTERNAL", response="")
    )
    c.expect_connection_close(out, 403)
    assert c.conn.closed


def test_unknown_vhost_is_refused_with_530():
    c = Client()
    c.feed(PROTOCOL_HEADER)
    c.send(0, start_ok())
    c.send(0, commands.Connection.TuneOk(2047, 131072, 0))
    c.expect_connection_close(c.send(0, commands.Connection.Open("/nope")), 530)


def test_tune_ok_frame_max_below_minimum_is_refused():
    c = Client()
    c.feed(PROTOCOL_HEADER)
    c.send(0, start_ok())
    c.expect_connection_close(c.send(0, commands.Connection.TuneOk(2047, 1024, 0)), 530)


# -- heartbeats and timers --------------------------------------------------------------------


def test_missed_heartbeats_close_the_connection():
    c = Client()
    c.handshake(heartbeat=10)
    clock = c.clock
    clock.now += 5
    c.conn.tick(clock.now)
    # idle for heartbeat/2: the server sends its own heartbeat
    assert c.conn.data_to_send() == HEARTBEAT_FRAME
    clock.now += 10
    c.feed(Heartbeat.marshal())  # the client is alive at +15
    clock.now += 19
    c.conn.tick(clock.now)
    assert not c.conn.closed
    c.replies()
    clock.now += 2  # 21 s of silence > 2 * heartbeat
    c.conn.tick(clock.now)
    assert c.conn.closed
    assert "heartbeat" in c.conn.close_reason


def test_any_frame_counts_as_liveness():
    c = Client()
    c.handshake(heartbeat=4)
    c.open_channel(1)
    for _ in range(10):
        c.clock.now += 7
        c.send(1, commands.Basic.Qos(prefetch_count=1))
        c.conn.tick(c.clock.now)
        assert not c.conn.closed


def test_heartbeat_zero_never_times_out():
    c = Client()
    c.handshake(heartbeat=0)
    c.clock.now += 10_000
    c.conn.tick(c.clock.now)
    assert not c.conn.closed
    assert c.conn.data_to_send() == b""


def test_handshake_timeout():
    c = Client()
    c.feed(PROTOCOL_HEADER)
    c.clock.now += 5
    c.conn.tick(c.clock.now)
    assert not c.conn.closed
    c.clock.now += 10
    c.conn.tick(c.clock.now)
    assert c.conn.closed


def test_close_ok_timeout_after_server_close(amqp):
    amqp.expect_connection_close(
        amqp.feed(struct.pack("!BHI", 1, 0, 4) + b"\x00\x63\x00\x01\xce"), 540
    )
    assert amqp.conn.state is ConnectionState.CLOSING
    amqp.clock.now += 10
    amqp.conn.tick(amqp.clock.now)
    assert amqp.conn.closed


# -- connection exceptions ---------------------------------------------------------------------


def raw(ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack("!BHI", ftype, channel, len(payload)) + payload + end


@pytest.mark.parametrize("channel", [0, 1])
def test_unknown_method_is_540(amqp, channel):
    amqp.open_channel(1)
    out = amqp.feed(raw(1, channel, struct.pack("!HH", 99, 1)))
    close = amqp.expect_connection_close(out, 540)
    assert "NOT_IMPLEMENTED" in close.reply_text
    # after connection.close the server ignores everything but close / close-ok
    assert amqp.send(1, commands.Queue.Declare(queue="ignored")) == []
    assert amqp.send(0, commands.Connection.CloseOk()) == []
    assert amqp.conn.closed


def test_unknown_method_in_known_class_is_540(amqp):
    amqp.open_channel(1)
    amqp.expect_connection_close(amqp.feed(raw(1, 1, struct.pack("!HH", 50, 99))), 540)


def test_frame_on_unopened_channel_is_504(amqp):
    out = amqp.send(5, commands.Queue.Declare(queue="q"))
    close = amqp.expect_connection_close(out, 504)
    assert "CHANNEL_ERROR" in close.reply_text


def test_channel_open_twice_is_504(amqp):
    amqp.open_channel(1)
    amqp.expect_connection_close(amqp.send(1, commands.Channel.Open()), 504)


def test_channel_above_channel_max_is_refused(amqp):
    amqp.conn.channel_max = 10
    amqp.expect_connection_close(amqp.send(11, commands.Channel.Open()), 504)


def test_content_body_without_header_is_505(amqp):
    amqp.open_channel(1)
    out = amqp.feed(frame.marshal(pbody.ContentBody(b"stray"), 1))
    close = amqp.expect_connection_close(out, 505)
    assert "UNEXPECTED_FRAME" in close.reply_text


def test_content_header_without_publish_is_505(amqp):
    amqp.open_channel(1)
    out = amqp.feed(frame.marshal(pheader.ContentHeader(0, 3), 1))
    amqp.expect_connection_close(out, 505)


def test_method_instead_of_content_header_is_505(amqp):
    amqp.open_channel(1)
    out = amqp.send(
        1,
        commands.Basic.Publish(exchange="", routing_key="q"),
        commands.Basic.Qos(prefetch_count=1),
    )
    amqp.expect_connection_close(out, 505)


def test_content_on_unopened_channel_is_505(amqp):
    amqp.expect_connection_close(amqp.feed(frame.marshal(pbody.ContentBody(b"x"), 3)), 505)


def test_body_longer_than_declared_is_505(amqp):
    amqp.open_channel(1)
    data = frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1)
    data += frame.marshal(pheader.ContentHeader(0, 2), 1)
    data += frame.marshal(pbody.ContentBody(b"abc"), 1)
    amqp.expect_connection_close(amqp.feed(data), 505)


def test_bad_frame_end_is_501(amqp):
    amqp.open_channel(1)
    payload = frame.marshal(commands.Basic.Qos(prefetch_count=1), 1)[7:-1]
    amqp.expect_connection_close(amqp.feed(raw(1, 1, payload, b"\x00")), 501)


def test_frames_before_a_bad_frame_end_are_still_processed(amqp):
    amqp.open_channel(1)
    good = frame.marshal(commands.Queue.Declare(queue="before-bad"), 1)
    out = amqp.feed(good + raw(1, 1, b"\x00\x0a\x00\x0a", b"X"))
    assert isinstance(out[0][1], commands.Queue.DeclareOk)
    amqp.expect_connection_close(out, 501)


def test_oversize_frame_is_501():
    c = Client()
    c.handshake(frame_max=4096)
    c.open_channel(1)
    c.expect_connection_close(c.feed(struct.pack("!BHI", 3, 1, 5000) + b"x" * 100), 501)


def test_unknown_frame_type_is_501(amqp):
    amqp.expect_connection_close(amqp.feed(raw(7, 0, b"")), 501)


def test_heartbeat_on_a_channel_is_501(amqp):
    amqp.open_channel(1)
    amqp.expect_connection_close(amqp.feed(raw(8, 1, b"")), 501)


def test_bad_field_table_is_502(amqp):
    amqp.open_channel(1)
    payload = frame.marshal(commands.Queue.Declare(queue="q", arguments={"k": "v"}), 1)[7:-1]
    payload = payload.replace(b"\x01kS", b"\x01k?")  # unknown field-value type
    amqp.expect_connection_close(amqp.feed(raw(1, 1, payload)), 502)


def test_truncated_method_is_502(amqp):
    amqp.open_channel(1)
    payload = frame.marshal(commands.Queue.Declare(queue="qqqq"), 1)[7:-1]
    amqp.expect_connection_close(amqp.feed(raw(1, 1, payload[:8])), 502)


def test_truncated_publish_is_502(amqp):
    amqp.open_channel(1)
    payload = frame.marshal(commands.Basic.Publish(exchange="ex", routing_key="rk"), 1)[7:-1]
    amqp.expect_connection_close(amqp.feed(raw(1, 1, payload[:-3])), 502)


def test_wrong_method_during_handshake_is_503():
    c = Client()
    c.feed(PROTOCOL_HEADER)
    out = c.send(0, commands.Connection.Open("/"))
    c.expect_connection_close(out, 503)


def test_channel_method_on_channel_zero_is_503(amqp):
    amqp.expect_connection_close(amqp.send(0, commands.Queue.Declare(queue="q")), 503)


# -- channel exceptions ---------------------------------------------------------------------------


def test_channel_error_closes_only_the_channel(amqp):
    amqp.open_channel(1)
    amqp.open_channel(2)
    out = amqp.send(1, commands.Queue.Declare(queue="missing", passive=True))
    assert [(c, type(m)) for c, m in out] == [(1, commands.Channel.Close)]
    close = out[0][1]
    assert close.reply_code == 404
    assert (close.class_id, close.method_id) == (50, 10)
    # until close-ok, the closed channel's methods are dropped
    assert amqp.send(1, commands.Queue.Declare(queue="dropped")) == []
    assert "dropped" not in amqp.conn.vhost.queues
    # the other channel is untouched
    out = amqp.send(2, commands.Queue.Declare(queue="fine"))
    assert isinstance(out[0][1], commands.Queue.DeclareOk)
    assert amqp.send(1, commands.Channel.CloseOk()) == []
    amqp.open_channel(1)  # the number is free again
    assert amqp.conn.state is ConnectionState.OPEN


def test_exclusive_queue_goes_with_its_connection():
    broker = make_broker()
    a = Client(broker=broker)
    a.handshake()
    a.open_channel(1)
    a.send(1, commands.Queue.Declare(queue="mine", exclusive=True))
    b = Client(broker=broker)
    b.handshake()
    b.open_channel(1)
    out = b.send(1, commands.Queue.Declare(queue="mine", passive=True))
    assert out[0][1].reply_code == 405
    a.send(0, commands.Connection.Close(200, "", 0, 0))
    assert "mine" not in broker.vhosts["/"].queues


def test_unacked_messages_are_requeued_when_the_connection_is_lost():
    broker = make_broker()
    a = Client(broker=broker)
    a.handshake()
    a.open_channel(1)
    a.send(1, commands.Queue.Declare(queue="jobs"))
    a.feed(publish_frames(1, "", "jobs", b"job"))
    out = a.send(1, commands.Basic.Get(queue="jobs"))
    assert isinstance(out[0][1], commands.Basic.GetOk)
    assert broker.vhosts["/"].queues["jobs"].message_count == 0
    a.conn.connection_lost()
    queue = broker.vhosts["/"].queues["jobs"]
    assert queue.message_count == 1
    assert queue.peek()[1] is True  # redelivered


def test_undecodable_content_properties_are_502_and_never_queued(amqp):
    amqp.open_channel(1)
    amqp.send(
        1,
        commands.Queue.Declare(queue="victim"),
        commands.Queue.Bind(queue="victim", exchange="amq.headers", arguments={}),
    )
    amqp.replies()
    header = struct.pack("!HHQ", 60, 0, 1) + b"\x20\x00" + struct.pack("!I", 500) + b"\x01k"
    for exchange, key in (("", "victim"), ("amq.headers", "")):
        c = Client(broker=amqp.broker)
        c.handshake()
        c.open_channel(1)
        data = frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), 1)
        out = c.feed(data + raw(2, 1, header) + raw(3, 1, b"x"))
        c.expect_connection_close(out, 502)
    assert amqp.broker.vhosts["/"].queues["victim"].message_count == 0


def test_a_broker_bug_costs_one_connection_a_541(amqp, monkeypatch, caplog):
    amqp.open_channel(1)
    channel = amqp.conn.channels[1]

    def explode(payload):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(channel, "handle_method", explode)
    out = amqp.send(1, commands.Basic.Qos(prefetch_count=1))
    close = amqp.expect_connection_close(out, 541)
    assert "INTERNAL_ERROR" in close.reply_text
    assert "simulated bug" in caplog.text


def test_confirms_are_sent_before_channel_close_ok(amqp):
    """A pipelining client may close the channel right after publishing: it still gets its ack."""
    amqp.open_channel(1)
    amqp.send(1, commands.Queue.Declare(queue="acked"), commands.Confirm.Select())
    amqp.replies()
    out = amqp.feed(
        publish_frames(1, "", "acked", b"a")
        + publish_frames(1, "", "acked", b"b")
        + frame.marshal(commands.Channel.Close(200, "", 0, 0), 1)
    )
    assert [type(m) for _, m in out] == [commands.Basic.Ack, commands.Channel.CloseOk]
    assert (out[0][1].delivery_tag, out[0][1].multiple) == (2, True)


def test_confirms_are_sent_before_a_channel_error(amqp):
    amqp.open_channel(1)
    amqp.send(1, commands.Queue.Declare(queue="acked"), commands.Confirm.Select())
    amqp.replies()
    out = amqp.feed(
        publish_frames(1, "", "acked", b"a") + publish_frames(1, "no-such-exchange", "x", b"b")
    )
    assert [type(m) for _, m in out] == [commands.Basic.Ack, commands.Channel.Close]
    assert out[0][1].delivery_tag == 1 and out[1][1].reply_code == 404


def test_confirms_are_sent_before_connection_close_ok(amqp):
    amqp.open_channel(1)
    amqp.send(1, commands.Queue.Declare(queue="acked"), commands.Confirm.Select())
    amqp.replies()
    out = amqp.feed(
        publish_frames(1, "", "acked", b"a")
        + frame.marshal(commands.Connection.Close(200, "", 0, 0), 0)
    )
    assert [type(m) for _, m in out] == [commands.Basic.Ack, commands.Connection.CloseOk]


def unchecked(cls, **fields):
    """A pamqp method built (and encodable) without pamqp's client-side name rules."""
    lax = type(cls.__name__, (cls,), {"validate": lambda self: None})
    method = lax.__new__(lax)
    defaults = cls()
    for slot in cls.__slots__:
        setattr(method, slot, fields.get(slot, getattr(defaults, slot)))
    return method


@pytest.mark.parametrize("name", ["café", "jobs{1}", "x" * 200])
def test_names_outside_pamqps_client_rules(amqp, name):
    """RabbitMQ takes any UTF-8 name up to 255 bytes; so must the broker, both ways."""
    amqp.open_channel(1)
    out = amqp.send(1, unchecked(commands.Queue.Declare, queue=name))
    assert [type(m) for _, m in out] == [commands.Queue.DeclareOk]
    assert out[0][1].queue == name
    out = amqp.send(1, unchecked(commands.Exchange.Declare, exchange=name, exchange_type="fanout"))
    assert [type(m) for _, m in out] == [commands.Exchange.DeclareOk]
    out = amqp.send(1, unchecked(commands.Queue.Bind, queue=name, exchange=name))
    assert [type(m) for _, m in out] == [commands.Queue.BindOk]
    out = amqp.send(
        1,
        unchecked(commands.Basic.Publish, exchange=name, routing_key=name, mandatory=True),
    )
    amqp.feed(
        frame.marshal(pheader.ContentHeader(0, 1), 1) + frame.marshal(pbody.ContentBody(b"m"), 1)
    )
    out = amqp.send(1, unchecked(commands.Basic.Get, queue=name, no_ack=True))
    assert isinstance(out[0][1], commands.Basic.GetOk)
    assert (out[0][1].exchange, out[0][1].routing_key) == (name, name)
    # and basic.return for a mandatory message nobody takes
    amqp.send(1, unchecked(commands.Queue.Unbind, queue=name, exchange=name))
    amqp.replies()
    amqp.send(1, unchecked(commands.Basic.Publish, exchange=name, routing_key="k", mandatory=True))
    out = amqp.feed(
        frame.marshal(pheader.ContentHeader(0, 1), 1) + frame.marshal(pbody.ContentBody(b"m"), 1)
    )
    assert isinstance(out[0][1], commands.Basic.Return)
    assert out[0][1].exchange == name


def test_deleting_the_queue_it_consumes_from_answers_delete_ok_before_the_cancel():
    """RabbitMQ's order: the channel that deletes the queue gets queue.delete-ok,
    then basic.cancel for its consumer on it (kombu's SimpleQueue.queue.delete()
    raises ConsumerCancelled on the other order); a consumer on another channel
    is told at once."""
    c = Client()
    c.feed(PROTOCOL_HEADER)
    c.send(0, start_ok(caps={"consumer_cancel_notify": True}))
    c.send(0, commands.Connection.TuneOk(2047, 131072, 0))
    c.send(0, commands.Connection.Open("/"))
    c.open_channel(1)
    c.open_channel(2)
    c.send(1, commands.Queue.Declare(queue="gone"))
    c.send(1, commands.Basic.Consume(queue="gone", consumer_tag="mine"))
    c.send(2, commands.Basic.Consume(queue="gone", consumer_tag="theirs"))
    out = c.send(1, commands.Queue.Delete(queue="gone"))
    assert [(ch, type(m)) for ch, m in out] == [
        (2, commands.Basic.Cancel),
        (1, commands.Queue.DeleteOk),
        (1, commands.Basic.Cancel),
    ]
    assert [m.consumer_tag for _, m in out if isinstance(m, commands.Basic.Cancel)] == [
        "theirs",
        "mine",
    ]
