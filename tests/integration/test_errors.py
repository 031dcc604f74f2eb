"""Bad input on a real socket gets the right AMQP error, and hurts nobody else (DESIGN section 10).

Each test speaks raw AMQP (pamqp-encoded frames, hand-made bad bytes) to a
running brokerd and decodes the reply with pamqp. A pika connection opened
before the abuse must keep working after it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
from pamqp import body as pbody
from pamqp import commands, encode, frame
from pamqp import header as pheader

from tests.brokerd_process import BrokerProcess

pytestmark = pytest.mark.integration

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def raw_frame(ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack("!BHI", ftype, channel, len(payload)) + payload + end


def method_payload(method) -> bytes:
    return frame.marshal(method, 0)[7:-1]


def encode_frames(*items: tuple[int, object]) -> bytes:
    return b"".join(frame.marshal(value, channel) for channel, value in items)


def publish_frames(channel: int, exchange: str, key: str, body: bytes) -> bytes:
    return encode_frames(
        (channel, commands.Basic.Publish(exchange=exchange, routing_key=key)),
        (channel, pheader.ContentHeader(0, len(body), commands.Basic.Properties())),
        (channel, pbody.ContentBody(body)),
    )


class RawClient:
    """A socket speaking AMQP by hand; replies are decoded with pamqp."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frames(self, *items: tuple[int, object]) -> None:
        self.send(encode_frames(*items))

    def _fill(self, deadline: float) -> bool:
        """Read once; False on timeout or EOF."""
        remaining = deadline - time.monotonic()
        if remaining <= 0 or self.eof:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def next_frame(self, timeout: float = 5.0) -> tuple[int, object] | None:
        """The next whole frame, decoded by pamqp, or None on timeout/EOF."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                (size,) = struct.unpack_from("!I", self.buf, 3)
                if len(self.buf) >= size + 8:
                    consumed, channel, value = frame.unmarshal(self.buf[: size + 8])
                    self.buf = self.buf[consumed:]
                    return channel, value
            if not self._fill(deadline):
                return None

    def expect(self, kind: type, timeout: float = 5.0, channel: int | None = None):
        """Skip heartbeats; the next frame must be a ``kind``."""
        while True:
            got = self.next_frame(timeout)
            assert got is not None, f"expected {kind.__name__}, got EOF/timeout (buf={self.buf!r})"
            ch, value = got
            if type(value).__name__ == "Heartbeat":
                continue
            assert isinstance(value, kind), (
                f"expected {kind.__name__}, got {value!r} ({vars(value)})"
            )
            if channel is not None:
                assert ch == channel
            return value

    def wait_eof(self, timeout: float = 5.0) -> bytes:
        """Everything until the server closes the socket."""
        deadline = time.monotonic() + timeout
        while self._fill(deadline):
            pass
        assert self.eof, f"server did not close the socket within {timeout}s"
        data, self.buf = self.buf, b""
        return data

    def handshake(self, frame_max: int = 131072, heartbeat: int = 0) -> None:
        self.send(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        self.send_frames(
            (
                0,
                commands.Connection.StartOk(
                    client_properties={
                        "product": "raw-test",
                        "capabilities": {"authentication_failure_close": True},
                    },
                    mechanism="PLAIN",
                    response="\0guest\0guest",
                ),
            )
        )
        self.expect(commands.Connection.Tune)
        self.send_frames(
            (0, commands.Connection.TuneOk(2047, frame_max, heartbeat)),
            (0, commands.Connection.Open("/")),
        )
        self.expect(commands.Connection.OpenOk)

    def open_channel(self, number: int = 1) -> None:
        self.send_frames((number, commands.Channel.Open()))
        self.expect(commands.Channel.OpenOk, channel=number)

    def expect_connection_close(self, code: int, timeout: float = 5.0) -> commands.Connection.Close:
        """Connection.close with ``code``; answer close-ok; the server then drops the socket."""
        close = self.expect(commands.Connection.Close, timeout)
        assert close.reply_code == code, close.reply_text
        with contextlib.suppress(OSError):  # the server may have dropped us (before tune)
            self.send_frames((0, commands.Connection.CloseOk()))
        self.wait_eof(timeout)
        return close


@pytest.fixture(scope="module")
def bystander(broker: BrokerProcess) -> Iterator[pika.BlockingConnection]:
    """A pika connection that must not notice the errors of others."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("bystander-q")
    ch.queue_purge("bystander-q")
    for i in range(5):
        ch.basic_publish("", "bystander-q", f"kept-{i}".encode())
    ch.close()
    yield conn
    conn.close()


@pytest.fixture(autouse=True)
def others_are_unharmed(
    broker: BrokerProcess, bystander: pika.BlockingConnection
) -> Iterator[None]:
    yield
    assert broker.alive(), broker.log_text()[-3000:]
    ch = bystander.channel()
    ch.confirm_delivery()
    body = f"ping-{time.monotonic()}".encode()
    ch.basic_publish("", "bystander-q", body)
    assert ch.queue_declare("bystander-q", passive=True).method.message_count == 6
    for i in range(5):  # nothing lost: the old messages first, in order
        _, _, got = ch.basic_get("bystander-q", auto_ack=False)
        assert got == f"kept-{i}".encode()
    _, _, got = ch.basic_get("bystander-q", auto_ack=True)
    assert got == body
    ch.basic_recover(requeue=True)
    ch.close()
    # and a brand new connection still works
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as fresh:
        assert fresh.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[RawClient]:
    with RawClient(broker.port) as client:
        yield client


@pytest.fixture
def opened(raw: RawClient) -> RawClient:
    raw.handshake(frame_max=4096)
    raw.open_channel(1)
    return raw


# -- the protocol header ------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x09", b"GET / HTTP/1.1\r\n\r\n"]
)
def test_wrong_protocol_header(raw, header):
    raw.send(header)
    assert raw.wait_eof() == PROTOCOL_HEADER


def test_good_header_then_garbage_before_start_ok(raw):
    raw.send(PROTOCOL_HEADER)
    raw.expect(commands.Connection.Start)
    raw.send(raw_frame(1, 0, method_payload(commands.Connection.Open("/")), end=b"\x00"))
    raw.expect_connection_close(501)


@pytest.mark.slow
def test_silent_client_is_dropped_after_the_handshake_timeout(raw):
    raw.send(PROTOCOL_HEADER)
    raw.expect(commands.Connection.Start)
    raw.wait_eof(timeout=15)


# -- 501 frame errors ---------------------------------------------------------------------


def test_bad_frame_end_is_501(opened):
    opened.send(raw_frame(1, 1, method_payload(commands.Basic.Qos(prefetch_count=1)), end=b"\xcf"))
    close = opened.expect_connection_close(501)
    assert close.reply_text.startswith("FRAME_ERROR")


def test_frame_above_negotiated_frame_max_is_501(opened):
    opened.send(struct.pack("!BHI", 3, 1, 4096) + b"x" * 4097)
    opened.expect_connection_close(501)


def test_huge_length_field_is_501_without_waiting_for_the_body(opened):
    opened.send(struct.pack("!BHI", 1, 1, 0xFFFFFFF0) + b"\x00\x3c")
    opened.expect_connection_close(501, timeout=3)


def test_unknown_frame_type_is_501(opened):
    opened.send(raw_frame(9, 1, b"abc"))
    opened.expect_connection_close(501)


# -- 502 syntax errors --------------------------------------------------------------------


def test_bad_field_table_is_502(opened):
    payload = method_payload(commands.Queue.Declare(queue="q", arguments={"k": "v"}))
    payload = payload.replace(b"\x01kS", b"\x01k?")  # unknown field-value type
    opened.send(raw_frame(1, 1, payload))
    close = opened.expect_connection_close(502)
    assert close.reply_text.startswith("SYNTAX_ERROR")


def test_field_table_longer_than_the_frame_is_502(opened):
    table = encode.field_table({"k": "v"})
    payload = method_payload(commands.Exchange.Declare(exchange="e", arguments={"k": "v"}))
    assert payload.endswith(table)
    bad = payload[: -len(table)] + struct.pack("!I", 1000) + table[4:]
    opened.send(raw_frame(1, 1, bad))
    opened.expect_connection_close(502)


def declare_with_table(raw_table: bytes) -> bytes:
    head = method_payload(
        commands.Exchange.Declare(
            exchange="errs-t", exchange_type="direct", auto_delete=True, arguments={}
        )
    )[:-4]
    return raw_frame(1, 1, head + raw_table)


def table(entries: bytes, length: int | None = None) -> bytes:
    return struct.pack("!I", len(entries) if length is None else length) + entries


@pytest.mark.parametrize(
    "raw_table",
    [
        table(b"\xffaS\x00\x00\x00\x01b"),
        table(b"\x01aS" + struct.pack("!I", 100) + b"b"),
        table(b"\x01aI\x00\x00\x00\x01", length=3),
        table(b"\x01a"),
    ],
    ids=["key-past-end", "string-past-end", "entries-past-end", "key-without-value"],
)
def test_malformed_tables_pamqp_would_let_through_are_502(opened, raw_table):
    """RabbitMQ refuses these (501 or a dropped socket); pamqp alone would decode garbage."""
    opened.send(declare_with_table(raw_table))
    opened.expect_connection_close(502)


def test_deeply_nested_table_is_502(raw):
    """Nesting deeper than Python's recursion limit is a syntax error, not a broker crash."""
    raw.handshake(frame_max=131072)
    raw.open_channel(1)
    nested = table(b"")
    for _ in range(3000):
        nested = table(b"\x01kF" + nested)
    raw.send(declare_with_table(nested))
    raw.expect_connection_close(502)


def test_truncated_method_is_502(opened):
    payload = method_payload(commands.Queue.Declare(queue="some-queue"))
    opened.send(raw_frame(1, 1, payload[:9]))
    opened.expect_connection_close(502)


def test_bad_utf8_in_a_short_string_is_502(opened):
    payload = method_payload(commands.Queue.Declare(queue="ab")).replace(b"\x02ab", b"\x02\xff\xfe")
    opened.send(raw_frame(1, 1, payload))
    opened.expect_connection_close(502)


def test_truncated_publish_is_502(opened):
    payload = method_payload(commands.Basic.Publish(exchange="", routing_key="abc"))
    opened.send(raw_frame(1, 1, payload[:-2]))
    opened.expect_connection_close(502)


@pytest.mark.parametrize("exchange", ["", "amq.headers"])
def test_undecodable_content_properties_are_502(opened, broker, exchange):
    """A property list nobody could decode is refused at publish (RabbitMQ: 541), so it can
    neither break routing nor reach, and kill, a consumer."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.queue_declare("bad-props", auto_delete=False)
        ch.queue_purge("bad-props")
        ch.queue_bind("bad-props", "amq.headers", arguments={"x-match": "all"})
        header = struct.pack("!HHQ", 60, 0, 1) + b"\x20\x00" + struct.pack("!I", 500) + b"\x01k"
        key = "bad-props" if exchange == "" else ""
        opened.send(
            encode_frames((1, commands.Basic.Publish(exchange=exchange, routing_key=key)))
            + raw_frame(2, 1, header)
            + raw_frame(3, 1, b"x")
        )
        opened.expect_connection_close(502)
        assert ch.queue_declare("bad-props", passive=True).method.message_count == 0
        ch.queue_delete("bad-props")


# -- 503 / 504 / 505 ----------------------------------------------------------------------


def test_method_on_unopened_channel_is_504(raw):
    raw.handshake()
    raw.send_frames((7, commands.Queue.Declare(queue="q")))
    close = raw.expect_connection_close(504)
    assert close.reply_text.startswith("CHANNEL_ERROR")


def test_channel_open_twice_is_504(opened):
    opened.send_frames((1, commands.Channel.Open()))
    opened.expect_connection_close(504)


def test_frames_on_a_closed_channel_are_504(opened):
    opened.send_frames((1, commands.Channel.Close(200, "", 0, 0)))
    opened.expect(commands.Channel.CloseOk, channel=1)
    opened.send_frames((1, commands.Basic.Qos(prefetch_count=1)))
    opened.expect_connection_close(504)


def test_body_without_header_is_505(opened):
    opened.send_frames((1, pbody.ContentBody(b"stray")))
    close = opened.expect_connection_close(505)
    assert close.reply_text.startswith("UNEXPECTED_FRAME")


def test_header_on_unopened_channel_is_505(opened):
    opened.send_frames((9, pheader.ContentHeader(0, 1)))
    opened.expect_connection_close(505)


def test_method_between_publish_and_header_is_505(opened):
    opened.send_frames(
        (1, commands.Basic.Publish(exchange="", routing_key="x")),
        (1, commands.Basic.Qos(prefetch_count=1)),
    )
    opened.expect_connection_close(505)


def test_channel_method_on_channel_zero_is_503(opened):
    opened.send_frames((0, commands.Basic.Qos(prefetch_count=1)))
    opened.expect_connection_close(503)


# -- 540 ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("class_id", "method_id"), [(99, 1), (60, 99), (10, 77), (0, 0)])
@pytest.mark.parametrize("channel", [0, 1])
def test_unknown_class_or_method_is_540(opened, class_id, method_id, channel):
    opened.send(raw_frame(1, channel, struct.pack("!HH", class_id, method_id)))
    close = opened.expect_connection_close(540)
    assert close.reply_text.startswith("NOT_IMPLEMENTED")


def test_immediate_publish_is_540(opened):
    opened.send(publish_frames(1, "", "q", b"x").replace(b"\x01q\x00", b"\x01q\x02", 1))
    opened.expect_connection_close(540)


# -- the close handshake ------------------------------------------------------------------


def test_after_connection_close_only_close_ok_counts(opened):
    opened.send(raw_frame(1, 1, struct.pack("!HH", 99, 9)))
    close = opened.expect(commands.Connection.Close)
    assert close.reply_code == 540
    # these are ignored, not answered
    opened.send_frames((1, commands.Queue.Declare(queue="ignored")), (2, commands.Channel.Open()))
    assert opened.next_frame(timeout=0.5) is None and not opened.eof
    opened.send_frames((0, commands.Connection.CloseOk()))
    assert opened.wait_eof() == b""


def test_server_gives_up_waiting_for_close_ok(opened):
    opened.send(raw_frame(1, 1, struct.pack("!HH", 99, 9)))
    opened.expect(commands.Connection.Close)
    opened.wait_eof(timeout=8)  # CLOSE_TIMEOUT plus a tick


def test_client_initiated_close(opened):
    opened.send_frames((0, commands.Connection.Close(200, "bye", 0, 0)))
    opened.expect(commands.Connection.CloseOk)
    opened.wait_eof()


def test_missed_heartbeats_drop_the_connection(raw):
    raw.handshake(heartbeat=1)
    start = time.monotonic()
    raw.wait_eof(timeout=8)  # we never send anything: > 2 heartbeats of silence
    assert time.monotonic() - start >= 1.5


# -- channel exceptions stay on their channel ---------------------------------------------


def test_channel_errors_close_only_that_channel(opened):
    opened.open_channel(2)
    opened.send_frames((1, commands.Queue.Declare(queue="no-such-queue", passive=True)))
    close = opened.expect(commands.Channel.Close, channel=1)
    assert close.reply_code == 404 and (close.class_id, close.method_id) == (50, 10)
    opened.send_frames((1, commands.Channel.CloseOk()))
    opened.send_frames((2, commands.Queue.Declare(queue="", exclusive=True)))
    assert opened.expect(commands.Queue.DeclareOk, channel=2).queue.startswith("amq.gen-")
    opened.send_frames((1, commands.Channel.Open()))
    opened.expect(commands.Channel.OpenOk, channel=1)


@pytest.mark.parametrize(
    ("setup", "method", "code"),
    [
        ([], commands.Exchange.Declare(exchange="amq.nope", exchange_type="direct"), 403),
        ([], commands.Queue.Bind(queue="missing-q", exchange="amq.direct"), 404),
        (
            [commands.Exchange.Declare(exchange="errs-x", exchange_type="direct")],
            commands.Exchange.Declare(exchange="errs-x", exchange_type="fanout"),
            406,
        ),
        ([], commands.Basic.Ack(delivery_tag=99), 406),
        (
            [commands.Queue.Declare(queue="errs-h", auto_delete=True)],
            commands.Queue.Bind(queue="errs-h", exchange="amq.headers", arguments={"x-match": "?"}),
            406,
        ),
    ],
)
def test_soft_errors_get_channel_close(opened, setup, method, code):
    for m in setup:
        opened.send_frames((1, m))
        opened.next_frame()
    opened.send_frames((1, method))
    close = opened.expect(commands.Channel.Close, channel=1)
    assert close.reply_code == code, close.reply_text


def test_exclusive_queue_of_another_connection_is_405(opened, broker):
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as other:
        name = other.channel().queue_declare("", exclusive=True).method.queue
        opened.send_frames((1, commands.Queue.Declare(queue=name, passive=True)))
        close = opened.expect(commands.Channel.Close, channel=1)
        assert close.reply_code == 405


def test_pika_sees_channel_close_and_keeps_the_connection(broker):
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("definitely-missing", passive=True)
        assert info.value.reply_code == 404
        assert conn.is_open
        assert conn.channel().queue_declare("", exclusive=True).method.queue


@pytest.mark.parametrize("name", ["café", "jobs{1}", "ünï-cødé ✓", "x" * 200])
def test_names_rabbitmq_accepts_are_not_errors(broker, name):
    """Any UTF-8 name up to 255 bytes works, as in RabbitMQ (pamqp's client-side rules are
    narrower: they once turned these into 541s)."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        assert ch.queue_declare(name, auto_delete=True).method.queue == name
        ch.exchange_declare(name, "fanout")
        ch.queue_bind(name, name)
        ch.basic_publish(name, name, b"one")
        method, _, body = ch.basic_get(name, auto_ack=True)
        assert (method.exchange, method.routing_key, body) == (name, name, b"one")
        got = []
        ch.basic_consume(name, lambda c, m, p, b: got.append((m.exchange, b)), auto_ack=True)
        ch.basic_publish(name, "", b"two")
        conn.process_data_events(time_limit=0.5)
        assert got == [(name, b"two")]
        returned = []
        ch.add_on_return_callback(lambda c, m, p, b: returned.append((m.exchange, m.reply_code)))
        ch.queue_unbind(name, name)
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish(name, "k", b"three", mandatory=True)
        conn.process_data_events(time_limit=0.2)
        assert returned == [(name, 312)]
        ch.exchange_delete(name)
