"""Structured fuzzing of a running brokerd: field tables, non-ASCII and invalid UTF-8
names, deep nesting and handshake variants, built as raw frames.

pamqp refuses much of this client-side (names outside its character set,
unknown field types, invalid UTF-8), so frames are encoded here by hand.
Every reply must be valid AMQP with a proper reply code (never 541), the
process must stay up with a clean log, and a bystander must lose nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands

from tests.brokerd_process import BrokerProcess
from tests.integration.test_fuzz import (
    PROTOCOL_HEADER,
    Bystander,
    Reply,
    check_log,
    check_reply,
    exchange,
    fuzz_settings,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def bystander(broker: BrokerProcess) -> Iterator[Bystander]:
    b = Bystander(broker)
    yield b
    b.close()


# -- a hand-written encoder (accepts what pamqp would refuse) -------------------------


def shortstr(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw[:255]


def longstr(raw: bytes) -> bytes:
    return struct.pack("!I", len(raw)) + raw


def method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    payload = struct.pack("!HH", class_id, method_id) + args
    return struct.pack("!BHI", 1, channel, len(payload)) + payload + b"\xce"


def utf8(text: str) -> bytes:
    """UTF-8, with lone surrogates passed through as the invalid bytes a client could send."""
    return text.encode("utf-8", "surrogatepass")


# field values: (type tag, encoded body)
scalars = st.one_of(
    st.binary(max_size=20).map(lambda b: b"S" + longstr(b)),
    st.text(max_size=10).map(lambda t: b"S" + longstr(utf8(t))),
    st.integers(-(2**31), 2**31 - 1).map(lambda i: b"I" + struct.pack("!i", i)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: b"l" + struct.pack("!q", i)),
    st.booleans().map(lambda v: b"t" + bytes((v,))),
    st.floats(allow_nan=True).map(lambda f: b"d" + struct.pack("!d", f)),
    st.integers(0, 255).map(lambda v: b"b" + bytes((v,))),
    st.binary(min_size=5, max_size=5).map(lambda b: b"D" + b),  # decimal: scale + value
    st.integers(0, 2**64 - 1).map(lambda v: b"T" + struct.pack("!Q", v)),
    st.just(b"V"),
    st.binary(max_size=10).map(lambda b: b"x" + longstr(b)),
    st.sampled_from([b"?", b"Z\x00", b"\xff"]),  # unknown type tags
)
keys = st.one_of(st.text(max_size=12).map(utf8), st.binary(max_size=12))


def table_body(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(shortstr(k) + v for k, v in items)


values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(st.tuples(keys, inner), max_size=4).map(
            lambda items: b"F" + longstr(table_body(items))
        ),
        st.lists(inner, max_size=4).map(lambda vs: b"A" + longstr(b"".join(vs))),
    ),
    max_leaves=12,
)
tables = st.lists(st.tuples(keys, values), max_size=5).map(lambda items: longstr(table_body(items)))


def nested(depth: int, kind: str) -> bytes:
    """A value nested ``depth`` levels deep: tables in tables, or arrays in arrays."""
    value = b"I" + struct.pack("!i", 1)
    for _ in range(depth):
        value = b"F" + longstr(shortstr(b"k") + value) if kind == "F" else b"A" + longstr(value)
    return longstr(shortstr(b"deep") + value)


names = st.one_of(
    st.text(min_size=1, max_size=60).map(utf8),
    st.text(alphabet=st.characters(min_codepoint=0x80), min_size=1, max_size=85).map(utf8),
    st.binary(min_size=1, max_size=40),  # often invalid UTF-8
)


def handshake(client_properties: bytes = longstr(b"")) -> bytes:
    """Protocol header through channel 1 open, as raw frames."""
    return (
        PROTOCOL_HEADER
        + method(
            0,
            10,
            11,
            client_properties
            + shortstr(b"PLAIN")
            + longstr(b"\0guest\0guest")
            + shortstr(b"en_US"),
        )
        + method(0, 10, 31, struct.pack("!HIH", 2047, 131072, 0))
        + method(0, 10, 40, shortstr(b"/") + shortstr(b"") + b"\x00")
        + method(1, 20, 10, shortstr(b""))
    )


def queue_declare(name: bytes, arguments: bytes, passive: bool = False) -> bytes:
    bits = (1 if passive else 0) | 0b01000  # auto-delete
    return method(1, 50, 10, b"\x00\x00" + shortstr(name) + bytes((bits,)) + arguments)


def exchange_declare(name: bytes, kind: bytes, arguments: bytes) -> bytes:
    return method(1, 40, 10, b"\x00\x00" + shortstr(name) + shortstr(kind) + b"\x04" + arguments)


def queue_bind(queue: bytes, exch: bytes, key: bytes, arguments: bytes) -> bytes:
    return method(
        1,
        50,
        20,
        b"\x00\x00" + shortstr(queue) + shortstr(exch) + shortstr(key) + b"\x00" + arguments,
    )


def publish(exch: bytes, key: bytes, headers: bytes) -> bytes:
    props = struct.pack("!H", 0x2000) + headers  # only the headers property
    header = struct.pack("!HHQ", 60, 0, 1) + props
    return (
        method(1, 60, 40, b"\x00\x00" + shortstr(exch) + shortstr(key) + b"\x00")
        + struct.pack("!BHI", 2, 1, len(header))
        + header
        + b"\xce"
        + struct.pack("!BHI", 3, 1, 1)
        + b"x\xce"
    )


CLOSE = method(0, 10, 50, struct.pack("!H", 200) + shortstr(b"") + b"\x00\x00\x00\x00")


def run(broker: BrokerProcess, bystander: Bystander, data: bytes) -> Reply:
    reply = exchange(broker.port, [data])
    check_reply(reply)
    bystander.after_example(reply)
    return reply


# -- the tests --------------------------------------------------------------------------


@fuzz_settings(80)
@given(props=tables, args=tables, headers=tables, name=names)
def test_fuzz_field_tables(broker, bystander, props, args, headers, name) -> None:
    """Random tables (every field type, unknown tags, random keys) where clients put them."""
    data = (
        handshake(props)
        + exchange_declare(b"fz-h", b"headers", args)
        + queue_declare(name, args)
        + queue_bind(name, b"fz-h", b"", args)
        + publish(b"fz-h", b"k", headers)
        + CLOSE
    )
    run(broker, bystander, data)


@fuzz_settings(80)
@given(
    name=names,
    kind=st.sampled_from([b"direct", b"topic", b"x-selector", b"x-wild-headers", b"t\xc3\xa9"]),
    key=names,
)
def test_fuzz_non_ascii_and_invalid_utf8_names(broker, bystander, name, kind, key) -> None:
    data = (
        handshake()
        + exchange_declare(name, kind, longstr(b""))
        + queue_declare(name, longstr(b""), passive=True)
        + queue_declare(name, longstr(b""))
        + queue_bind(name, name, key, longstr(b""))
        + publish(name, key, longstr(b""))
        + method(1, 60, 20, b"\x00\x00" + shortstr(name) + shortstr(key) + b"\x00" + longstr(b""))
        + CLOSE
    )
    run(broker, bystander, data)


@pytest.mark.parametrize("kind", ["F", "A"])
@pytest.mark.parametrize("depth", [10, 100, 400, 5000])
def test_deep_nesting(broker: BrokerProcess, bystander: Bystander, kind: str, depth: int) -> None:
    """Deeply nested tables or arrays in client properties, arguments and headers."""
    deep = nested(depth, kind)
    for data in (
        handshake(deep) + CLOSE,
        handshake() + queue_declare(b"fz-deep", deep) + CLOSE,
        handshake()
        + exchange_declare(b"fz-deep-h", b"headers", longstr(b""))
        + queue_declare(b"fz-deep-q", longstr(b""))
        + queue_bind(b"fz-deep-q", b"fz-deep-h", b"", deep)
        + publish(b"fz-deep-h", b"", deep)
        + CLOSE,
    ):
        reply = run(broker, bystander, data)
        assert reply.frames, "the broker must answer (an error close at worst)"


@fuzz_settings(100)
@given(
    mechanism=st.one_of(st.sampled_from([b"PLAIN", b"AMQPLAIN", b"EXTERNAL", b""]), names),
    response=st.one_of(
        st.binary(max_size=40),
        st.tuples(names, names).map(lambda p: b"\0" + p[0] + b"\0" + p[1]),
        tables.map(lambda t: t[4:]),  # an AMQPLAIN table of random fields
    ),
    locale=st.binary(max_size=10),
    tune=st.tuples(st.integers(0, 65535), st.integers(0, 2**32 - 1), st.integers(0, 65535)),
    vhost=names,
    order=st.permutations(range(3)),
    repeat=st.integers(0, 2),
)
def test_fuzz_handshake_variants(
    broker, bystander, mechanism, response, locale, tune, vhost, order, repeat
) -> None:
    steps = [
        method(
            0, 10, 11, longstr(b"") + shortstr(mechanism) + longstr(response) + shortstr(locale)
        ),
        method(0, 10, 31, struct.pack("!HIH", *tune)),
        method(0, 10, 40, shortstr(vhost) + shortstr(b"") + b"\x00"),
    ]
    body = b"".join(steps[i] for i in order) + steps[order[0]] * repeat
    reply = run(broker, bystander, PROTOCOL_HEADER + body + method(1, 20, 10, shortstr(b"")))
    closes = [v for _, v in reply.frames if isinstance(v, commands.Connection.Close)]
    # any refusal says why with a code; an accepted handshake got that far only in order
    if any(isinstance(v, commands.Connection.OpenOk) for _, v in reply.frames):
        assert list(order) == [0, 1, 2]
    for close in closes:
        assert len(close.reply_text.encode()) <= 255


def test_after_structured_fuzzing(broker: BrokerProcess, bystander: Bystander) -> None:
    """Runs last: the bystander lost nothing and the log holds no traceback."""
    assert broker.alive()
    bystander.check_nothing_lost()
    check_log(broker)
