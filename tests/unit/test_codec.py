"""The wire codec without sockets: frame splitting, method decoding, the publish/deliver path.

Everything is checked against pamqp, the reference encoder/decoder the
broker's clients (aio-pika) also use.
"""

from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands, encode, frame
from pamqp import header as pheader

from brokerd.wire import codec
from brokerd.wire.codec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    FrameError,
    SyntaxError_,
    UnknownMethod,
)
from tests.support.examples import examples


def raw_frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack("!BHI", ftype, channel, len(payload)) + payload + bytes((end,))


def method_payload(method) -> bytes:
    """The payload of a method frame as pamqp encodes it (class/method ids + arguments)."""
    return frame.marshal(method, 1)[7:-1]


def unmarshal_all(data: bytes) -> list[tuple[int, object]]:
    out = []
    while data:
        consumed, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[consumed:]
    return out


# -- split_frames ----------------------------------------------------------------


class TestSplitFrames:
    def test_whole_frames_are_cut_out(self):
        a = frame.marshal(commands.Channel.Open(), 1)
        b = frame.marshal(commands.Basic.Qos(prefetch_count=5), 3)
        frames, pos = codec.split_frames(a + b + HEARTBEAT_FRAME, 0, 4096)
        assert pos == len(a) + len(b) + 8
        assert [(t, c) for t, c, _ in frames] == [(FRAME_METHOD, 1), (FRAME_METHOD, 3), (8, 0)]
        assert frames[0][2] == a[7:-1]
        assert frames[2][2] == b""

    def test_partial_input_is_left_for_the_next_call(self):
        data = frame.marshal(commands.Queue.Declare(queue="q1"), 2)
        for cut in range(len(data)):
            frames, pos = codec.split_frames(data[:cut], 0, 4096)
            assert frames == []
            assert pos == 0
        frames, pos = codec.split_frames(data, 0, 4096)
        assert len(frames) == 1
        assert pos == len(data)

    def test_trailing_partial_frame_after_whole_ones(self):
        a = frame.marshal(commands.Channel.Open(), 1)
        b = frame.marshal(commands.Channel.Open(), 2)
        frames, pos = codec.split_frames(a + b[:5], 0, 4096)
        assert len(frames) == 1
        assert pos == len(a)
        frames, pos = codec.split_frames(a + b, pos, 4096)
        assert [c for _, c, _ in frames] == [2]
        assert pos == len(a) + len(b)

    def test_starts_at_pos(self):
        a = frame.marshal(commands.Channel.Open(), 1)
        frames, pos = codec.split_frames(b"junk" + a, 4, 4096)
        assert len(frames) == 1 and pos == 4 + len(a)

    def test_accepts_bytearray(self):
        a = frame.marshal(commands.Channel.Open(), 1)
        frames, _ = codec.split_frames(bytearray(a), 0, 4096)
        assert isinstance(frames[0][2], bytes)

    def test_bad_frame_end(self):
        good = frame.marshal(commands.Channel.Open(), 1)
        bad = raw_frame(FRAME_METHOD, 1, method_payload(commands.Channel.Open()), end=0x00)
        with pytest.raises(FrameError, match="frame end") as info:
            codec.split_frames(good + bad, 0, 4096)
        # the frames before the bad one are handed back so they are still processed
        assert [c for _, c, _ in info.value.frames] == [1]

    def test_oversize_frame_refused_from_its_header_alone(self):
        # only the 7-byte header and one byte have arrived: no need to wait for 1 MB
        head = struct.pack("!BHI", FRAME_BODY, 1, 1_000_000) + b"x"
        with pytest.raises(FrameError, match="exceeds frame_max"):
            codec.split_frames(head, 0, 4096)

    def test_frame_of_exactly_frame_max_is_accepted(self):
        data = raw_frame(FRAME_BODY, 1, b"x" * (4096 - 8))
        frames, pos = codec.split_frames(data, 0, 4096)
        assert len(frames) == 1 and pos == 4096
        data = raw_frame(FRAME_BODY, 1, b"x" * (4096 - 7))
        with pytest.raises(FrameError):
            codec.split_frames(data, 0, 4096)

    def test_length_field_near_2_32_does_not_overflow(self):
        head = struct.pack("!BHI", FRAME_BODY, 1, 0xFFFFFFFF) + b"\xce"
        with pytest.raises(FrameError):
            codec.split_frames(head, 0, 131072)

    @settings(max_examples=examples(150))
    @given(
        payloads=st.lists(
            st.tuples(
                st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY]),
                st.integers(0, 65535),
                st.binary(max_size=300),
            ),
            max_size=8,
        ),
        cuts=st.lists(st.integers(0, 3000), max_size=10),
    )
    def test_any_chunking_gives_the_same_frames(self, payloads, cuts):
        stream = b"".join(raw_frame(t, c, p) for t, c, p in payloads)
        points = sorted({min(c, len(stream)) for c in cuts} | {len(stream)})
        buf = bytearray()
        got: list[tuple[int, int, bytes]] = []
        start = 0
        for point in points:
            buf += stream[start:point]
            start = point
            frames, pos = codec.split_frames(buf, 0, 4096)
            got += frames
            del buf[:pos]
        assert got == [(t, c, p) for t, c, p in payloads]
        assert not buf


# -- methods ---------------------------------------------------------------------

ROUND_TRIP_METHODS = [
    commands.Connection.StartOk(
        client_properties={"product": "test", "capabilities": {"basic.nack": True}},
        mechanism="PLAIN",
        response="\0guest\0guest",
        locale="en_US",
    ),
    commands.Connection.TuneOk(2047, 131072, 60),
    commands.Connection.Open("/"),
    commands.Connection.Close(320, "CONNECTION_FORCED - bye", 0, 0),
    commands.Channel.Open(),
    commands.Channel.Flow(active=False),
    commands.Exchange.Declare(
        exchange="x", exchange_type="topic", durable=True, arguments={"alternate-exchange": "ae"}
    ),
    commands.Exchange.Bind(destination="d", source="s", routing_key="a.#", arguments={}),
    commands.Queue.Declare(
        queue="q",
        durable=True,
        exclusive=True,
        auto_delete=True,
        arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"},
    ),
    commands.Queue.Bind(queue="q", exchange="amq.headers", arguments={"x-match": "any", "a": 1}),
    commands.Queue.Delete(queue="q", if_unused=True, if_empty=True, nowait=True),
    commands.Basic.Qos(prefetch_count=10, global_=True),
    commands.Basic.Consume(
        queue="q",
        consumer_tag="c1",
        no_local=True,
        no_ack=True,
        exclusive=True,
        nowait=False,
        arguments={"x-priority": 3},
    ),
    commands.Basic.Ack(delivery_tag=2**40, multiple=True),
    commands.Basic.Nack(delivery_tag=7, multiple=False, requeue=False),
    commands.Basic.Reject(delivery_tag=9, requeue=True),
    commands.Basic.Get(queue="q", no_ack=True),
    commands.Confirm.Select(nowait=True),
    commands.Tx.Commit(),
]


@pytest.mark.parametrize("method", ROUND_TRIP_METHODS, ids=lambda m: m.name)
def test_decode_method_round_trips_pamqp(method):
    decoded = codec.decode_method(method_payload(method))
    assert type(decoded) is type(method)
    for name in method.__slots__:
        assert getattr(decoded, name) == getattr(method, name), name


@pytest.mark.parametrize("method", ROUND_TRIP_METHODS, ids=lambda m: m.name)
def test_method_frame_matches_pamqp(method):
    assert codec.method_frame(5, method) == frame.marshal(method, 5)


@pytest.mark.parametrize("method", ROUND_TRIP_METHODS, ids=lambda m: m.name)
def test_decode_method_refuses_truncation(method):
    payload = method_payload(method)
    for cut in range(4, len(payload)):
        try:
            decoded = codec.decode_method(payload[:cut])
        except SyntaxError_:
            continue
        # a cut that happens to end on a field boundary must not invent values
        pytest.fail(f"truncated {method.name} at {cut} decoded as {vars(decoded)!r}")


def test_decode_method_unknown_class_or_method():
    with pytest.raises(UnknownMethod, match="class=99 method=1"):
        codec.decode_method(struct.pack("!HH", 99, 1))
    with pytest.raises(UnknownMethod):
        codec.decode_method(struct.pack("!HH", 60, 999) + b"\x00" * 8)


def test_decode_method_too_short():
    with pytest.raises(SyntaxError_):
        codec.decode_method(b"\x00\x14")


def test_decode_method_bad_field_table():
    table = encode.field_table({"k": "v"})
    payload = method_payload(commands.Queue.Declare(queue="q", arguments={"k": "v"}))
    assert payload.endswith(table)
    # a table that claims more bytes than the frame holds
    with pytest.raises(SyntaxError_):
        codec.decode_method(payload[: -len(table)] + struct.pack("!I", 10_000) + table[4:])
    # an unknown field-value type
    with pytest.raises(SyntaxError_):
        codec.decode_method(payload.replace(b"\x01kS", b"\x01k?"))


field_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(0, 2**31 - 1),
        st.integers(-(2**63), -(2**31)),
        st.floats(allow_nan=False, width=32),
        st.text(max_size=20),
    ),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(table=st.dictionaries(st.text(max_size=10), field_values, max_size=6))
def test_check_field_table_accepts_what_pamqp_encodes(table):
    encoded = encode.field_table(table)
    assert codec.check_field_table(encoded) == len(encoded)
    assert codec.check_field_table(b"xx" + encoded + b"tail", 2) == 2 + len(encoded)


def table(entries: bytes, length: int | None = None) -> bytes:
    return struct.pack("!I", len(entries) if length is None else length) + entries


@pytest.mark.parametrize(
    "raw",
    [
        table(b"\xffaS\x00\x00\x00\x01b"),  # key length runs past the table
        table(b"\x01aS" + struct.pack("!I", 100) + b"b"),  # string runs past the table
        table(b"\x01aI\x00\x00\x00\x01", length=3),  # entries longer than the table
        table(b"\x01a"),  # a key without a value
        table(b"\x01aI\x00\x00"),  # a value cut short
        table(b"\x01a?"),  # unknown type
        table(b"\x01aF" + table(b"\x01bS" + struct.pack("!I", 9) + b"x")),  # bad nested table
        table(b"\x01aA" + struct.pack("!I", 2) + b"I\x00\x00\x00\x00"),  # array item too long
        table(b"\x01aA" + struct.pack("!I", 50) + b"t\x01"),  # array longer than the table
        b"\x00\x00",  # no length at all
        struct.pack("!I", 10) + b"\x01",  # longer than the data
    ],
)
def test_check_field_table_refuses_malformed_tables(raw):
    with pytest.raises(SyntaxError_):
        codec.check_field_table(raw)
    # and so does method decoding, even where pamqp alone would not notice
    head = method_payload(commands.Exchange.Declare(exchange="e", arguments={}))[:-4]
    with pytest.raises(SyntaxError_):
        codec.decode_method(head + raw)
    # and the content properties check
    with pytest.raises(SyntaxError_):
        codec.check_properties(b"\x20\x00" + raw)


def test_deeply_nested_table_is_a_syntax_error_not_a_crash():
    raw = b""
    for _ in range(5000):
        raw = table(b"\x01kF" + raw) if raw else table(b"")
    head = method_payload(commands.Exchange.Declare(exchange="e", arguments={}))[:-4]
    with pytest.raises(SyntaxError_):
        codec.decode_method(head + raw)
    with pytest.raises(SyntaxError_):
        codec.check_properties(b"\x20\x00" + raw)


def test_decode_method_bad_utf8_short_string():
    payload = method_payload(commands.Queue.Declare(queue="ab"))
    payload = payload.replace(b"\x02ab", b"\x02\xff\xfe", 1)
    with pytest.raises(SyntaxError_):
        codec.decode_method(payload)


# -- basic.publish ----------------------------------------------------------------

#: pamqp refuses exchange names outside the spec's domain
EXCHANGE_NAMES = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:", max_size=127
)


@given(
    exchange=EXCHANGE_NAMES,
    routing_key=st.text(max_size=80).filter(lambda s: len(s.encode()) <= 255),
    mandatory=st.booleans(),
    immediate=st.booleans(),
)
def test_decode_publish_matches_pamqp(exchange, routing_key, mandatory, immediate):
    payload = method_payload(
        commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
        )
    )
    assert codec.decode_publish(payload) == (exchange, routing_key, mandatory, immediate)


def test_decode_publish_truncated_and_trailing():
    payload = method_payload(commands.Basic.Publish(exchange="ex", routing_key="rk"))
    for cut in range(6, len(payload)):
        with pytest.raises(SyntaxError_):
            codec.decode_publish(payload[:cut])
    with pytest.raises(SyntaxError_, match="trailing"):
        codec.decode_publish(payload + b"\x00")


def test_decode_publish_bad_utf8():
    payload = method_payload(commands.Basic.Publish(exchange="ab", routing_key="rk"))
    with pytest.raises(SyntaxError_):
        codec.decode_publish(payload.replace(b"\x02ab", b"\x02\xc3\x28", 1))


# -- content ----------------------------------------------------------------------

headers_values = st.one_of(
    st.text(max_size=20),
    st.integers(0, 2**31 - 1),  # pamqp cannot encode small negative table integers
    st.booleans(),
    st.none(),
)
# pamqp leaves falsy properties (empty strings) out when encoding: generate non-empty ones
properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | st.sampled_from(["text/plain", "application/json"]),
    headers=st.none()
    | st.dictionaries(st.text(min_size=1, max_size=10), headers_values, max_size=4),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 9),
    correlation_id=st.none() | st.text(min_size=1, max_size=30),
    reply_to=st.none() | st.text(min_size=1, max_size=30),
    message_id=st.none() | st.text(min_size=1, max_size=30),
    timestamp=st.none()
    | st.integers(0, 2**31).map(  # pamqp reads larger values as milliseconds
        lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)
    ),
    app_id=st.none() | st.text(min_size=1, max_size=10),
)


@settings(max_examples=examples(150))
@given(
    props=properties,
    body=st.binary(max_size=20_000),
    frame_max=st.sampled_from([4096, 5000, 131072]),
)
def test_content_frames_round_trip_through_pamqp(props, body, frame_max):
    data = codec.content_frames(7, codec.encode_properties(props), body, frame_max)
    frames, pos = codec.split_frames(data, 0, frame_max)
    assert pos == len(data)
    assert frames[0][0] == FRAME_HEADER
    assert all(t == FRAME_BODY for t, _, _ in frames[1:])
    assert all(len(p) + 8 <= frame_max for _, _, p in frames)
    assert all(c == 7 for _, c, _ in frames)
    # no empty body frames, and as few as frame_max allows
    assert all(p for _, _, p in frames[1:])
    assert len(frames) - 1 == -(-len(body) // (frame_max - 8))

    parsed = unmarshal_all(data)
    head = parsed[0][1]
    assert isinstance(head, pheader.ContentHeader)
    assert head.body_size == len(body)
    assert b"".join(f.value for _, f in parsed[1:] if isinstance(f, pbody.ContentBody)) == body
    for name in props.__slots__:
        assert getattr(head.properties, name) == getattr(props, name), name

    # and the broker's own decoder agrees with pamqp
    class_id, size, raw = codec.decode_header(frames[0][2])
    assert (class_id, size) == (60, len(body))
    mine = codec.decode_properties(raw)
    for name in props.__slots__:
        assert getattr(mine, name) == getattr(props, name), name


def test_content_frames_empty_body_is_header_only():
    data = codec.content_frames(1, b"\x00\x00", b"", 4096)
    frames, _ = codec.split_frames(data, 0, 4096)
    assert [t for t, _, _ in frames] == [FRAME_HEADER]


def test_content_frames_exact_multiple_of_frame_max():
    body = b"z" * ((4096 - 8) * 3)
    frames, _ = codec.split_frames(codec.content_frames(1, b"\x00\x00", body, 4096), 0, 4096)
    assert [len(p) for t, _, p in frames if t == FRAME_BODY] == [4088, 4088, 4088]


def test_decode_header_from_pamqp():
    head = pheader.ContentHeader(0, 12345, commands.Basic.Properties(content_type="a/b"))
    payload = frame.marshal(head, 1)[7:-1]
    class_id, size, raw = codec.decode_header(payload)
    assert (class_id, size) == (60, 12345)
    assert codec.decode_properties(raw).content_type == "a/b"


def test_decode_header_too_short():
    with pytest.raises(SyntaxError_):
        codec.decode_header(b"\x00\x3c\x00\x00")


def test_decode_properties_truncated():
    raw = codec.encode_properties(commands.Basic.Properties(content_type="text/plain", priority=3))
    for cut in range(len(raw)):
        with pytest.raises(SyntaxError_):
            codec.decode_properties(raw[:cut])


def test_decode_properties_bad_table():
    raw = bytearray(codec.encode_properties(commands.Basic.Properties(headers={"k": "v"})))
    raw[2:6] = struct.pack("!I", 999)
    with pytest.raises(SyntaxError_):
        codec.decode_properties(bytes(raw))


@settings(max_examples=examples(300))
@given(
    props=properties,
    flags=st.integers(0, 0xFFFF),
    cut=st.integers(0, 200),
    junk=st.binary(max_size=40),
    flip=st.tuples(st.integers(0, 200), st.integers(0, 255)),
)
def test_check_properties_accepts_exactly_what_decode_properties_decodes(
    props, flags, cut, junk, flip
):
    """Properties are checked on publish and decoded later, maybe for another connection:
    whatever passes the check must decode."""
    good = codec.encode_properties(props)
    flipped = bytearray(good)
    if flipped:
        flipped[flip[0] % len(flipped)] = flip[1]
    candidates = [good, good[:cut], struct.pack("!H", flags) + junk, bytes(flipped), good + junk]
    for raw in candidates:
        try:
            codec.decode_properties(raw)
            decodes = True
        except SyntaxError_:
            decodes = False
        try:
            codec.check_properties(raw)
            passes = True
        except SyntaxError_:
            passes = False
        assert passes == decodes, raw


def test_check_properties_examples():
    codec.check_properties(b"\x00\x00")
    codec.check_properties(
        codec.encode_properties(
            commands.Basic.Properties(
                content_type="text/plain",
                headers={"a": [1, "x", {"b": None}]},
                delivery_mode=2,
                timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
            )
        )
    )
    with pytest.raises(SyntaxError_):
        codec.check_properties(b"\x80\x00\x05ab")  # content_type longer than the frame
    with pytest.raises(SyntaxError_):
        codec.check_properties(b"\x80\x00\x02\xff\xfe")  # not UTF-8
    with pytest.raises(SyntaxError_):
        codec.check_properties(b"\x20\x00" + struct.pack("!I", 500) + b"\x01k")  # short table
    with pytest.raises(SyntaxError_):
        codec.check_properties(b"\x00\x01")  # a continuation flag word that is not there
    with pytest.raises(SyntaxError_):
        codec.check_properties(b"\x00")


def test_decode_header_refuses_undecodable_properties():
    head = struct.pack("!HHQ", 60, 0, 1)
    with pytest.raises(SyntaxError_):
        codec.decode_header(head + b"\x20\x00" + struct.pack("!I", 500) + b"\x01k")
    # and the cache of checked property lists does not let a bad one through later
    good = codec.encode_properties(commands.Basic.Properties(content_type="x"))
    for _ in range(2):
        assert codec.decode_header(head + good)[2] == good
        with pytest.raises(SyntaxError_):
            codec.decode_header(head + good[:-1])


def test_out_of_range_timestamp_is_tolerated():
    """Any 64-bit timestamp is legal on the wire; pamqp cannot make a datetime of all."""
    raw = b"\x00\x40" + struct.pack("!Q", 2**63 + 5)
    codec.check_properties(raw)
    assert codec.decode_properties(raw).timestamp is None
    raw = b"\x10\x40" + b"\x02" + struct.pack("!Q", 2**64 - 1)  # delivery_mode, timestamp
    props = codec.decode_properties(raw)
    assert props.delivery_mode == 2 and props.timestamp is None


def test_encode_properties_none():
    assert codec.encode_properties(None) == b"\x00\x00"
    assert codec.decode_properties(b"\x00\x00").content_type is None


# -- basic.deliver fast path -----------------------------------------------------------


@given(
    tag=st.text(max_size=30).filter(lambda s: len(s.encode()) <= 255),
    delivery_tag=st.integers(1, 2**63 - 1),  # pamqp decodes longlong as signed
    redelivered=st.booleans(),
    exchange=EXCHANGE_NAMES,
    routing_key=st.text(max_size=40),
)
def test_deliver_frame_decodes_with_pamqp(tag, delivery_tag, redelivered, exchange, routing_key):
    data = codec.deliver_frame(
        3, codec.shortstr(tag), delivery_tag, redelivered, codec.routing_tail(exchange, routing_key)
    )
    consumed, channel, method = frame.unmarshal(data)
    assert consumed == len(data) and channel == 3
    assert isinstance(method, commands.Basic.Deliver)
    assert (method.consumer_tag, method.delivery_tag, method.redelivered) == (
        tag,
        delivery_tag,
        redelivered,
    )
    assert (method.exchange, method.routing_key) == (exchange, routing_key)
    expected = commands.Basic.Deliver(tag, delivery_tag, redelivered, exchange, routing_key)
    assert data == frame.marshal(expected, 3)


def test_shortstr_limit():
    assert codec.shortstr("é") == b"\x02\xc3\xa9"
    with pytest.raises(ValueError):
        codec.shortstr("x" * 256)


@pytest.mark.parametrize("name", ["café", "jobs{1}", "a" * 200, "日本語", "sp ace/x@y#z"])
def test_server_sent_methods_echo_any_name(name):
    """RabbitMQ accepts any UTF-8 name up to 255 bytes; pamqp's client-side rules must not
    stop the broker from echoing one back."""
    for method in (
        commands.Queue.DeclareOk(name, 1, 2),
        commands.Basic.GetOk(1, False, name, name, 0),
        commands.Basic.Return(312, "NO_ROUTE", name, name),
    ):
        data = codec.method_frame(1, method)
        _, _, decoded = frame.unmarshal(data)
        assert data == frame.marshal(method, 1)
        for slot in method.__slots__:
            assert getattr(decoded, slot) == getattr(method, slot)


def test_checked_properties_cache_is_bounded():
    head = struct.pack("!HHQ", 60, 0, 1)
    big = codec.encode_properties(commands.Basic.Properties(headers={"k": "v" * 1000}))
    codec.decode_header(head + big)
    assert big not in codec._checked_properties  # large lists are checked every time
    for i in range(5000):
        props = codec.encode_properties(commands.Basic.Properties(message_id=str(i)))
        codec.decode_header(head + props)
        assert len(codec._checked_properties) <= 4096
