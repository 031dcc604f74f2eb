"""Field tables and property lists edited without decoding them.

Dead-lettering rewrites a message's headers (``x-death``) and drops its
``expiration``. RabbitMQ re-encodes from typed values, so every header a
client set keeps its wire type; a pamqp decode and re-encode would not
(a ``long`` of 1 comes back as a ``short-short``, a ``float`` as a
``double``). So the table is split into entries whose values stay as their
raw bytes (type tag and payload), only the entries the broker writes are
encoded here, with RabbitMQ's types, and the rest of the property list is
copied through untouched.
"""

from __future__ import annotations

import struct

from brokerd.wire.codec import _check_field_value, _property_flags

#: one table entry: the key and the raw value (type tag + payload)
Entry = tuple[bytes, bytes]

_u32 = struct.Struct("!I")
_i64 = struct.Struct("!q")
_u64 = struct.Struct("!Q")
_INTS = {
    ord("b"): ">b",
    ord("B"): ">B",
    ord("s"): ">h",
    ord("u"): ">H",
    ord("I"): ">i",
    ord("i"): ">I",
    ord("l"): ">q",
    ord("L"): ">Q",
}

#: basic property flags, in wire order
CONTENT_TYPE = 0x8000
CONTENT_ENCODING = 0x4000
HEADERS = 0x2000
DELIVERY_MODE = 0x1000
PRIORITY = 0x0800
CORRELATION_ID = 0x0400
REPLY_TO = 0x0200
EXPIRATION = 0x0100
MESSAGE_ID = 0x0080
TIMESTAMP = 0x0040
TYPE = 0x0020
USER_ID = 0x0010
APP_ID = 0x0008
CLUSTER_ID = 0x0004
#: how each property is laid out: s short string, o octet, t timestamp, F table
_LAYOUT = (
    (CONTENT_TYPE, "s"),
    (CONTENT_ENCODING, "s"),
    (HEADERS, "F"),
    (DELIVERY_MODE, "o"),
    (PRIORITY, "o"),
    (CORRELATION_ID, "s"),
    (REPLY_TO, "s"),
    (EXPIRATION, "s"),
    (MESSAGE_ID, "s"),
    (TIMESTAMP, "t"),
    (TYPE, "s"),
    (USER_ID, "s"),
    (APP_ID, "s"),
    (CLUSTER_ID, "s"),
)


# -- property lists ------------------------------------------------------------------


def split_properties(raw: bytes) -> dict[int, bytes]:
    """The properties present, by flag, each as its raw encoded bytes (a short
    string with its length byte, a table with its length word)."""
    if len(raw) < 2:
        return {}
    flags, pos = _property_flags(raw)
    fields: dict[int, bytes] = {}
    for flag, kind in _LAYOUT:
        if not flags & flag:
            continue
        if kind == "s":
            end = pos + 1 + raw[pos]
        elif kind == "o":
            end = pos + 1
        elif kind == "t":
            end = pos + 8
        else:
            end = pos + 4 + _u32.unpack_from(raw, pos)[0]
        fields[flag] = bytes(raw[pos:end])
        pos = end
    return fields


def join_properties(fields: dict[int, bytes]) -> bytes:
    """The property list ``split_properties`` took apart, as edited."""
    flags = 0
    parts = []
    for flag, _kind in _LAYOUT:
        value = fields.get(flag)
        if value is not None:
            flags |= flag
            parts.append(value)
    return flags.to_bytes(2, "big") + b"".join(parts)


def shortstr_value(field: bytes) -> bytes:
    """The text of a raw short-string property."""
    return field[1 : 1 + field[0]]


def user_id(raw: bytes) -> bytes | None:
    """The ``user-id`` property (None if absent): its flag is read without decoding,
    so a publish without one (nearly all) costs a bit test."""
    if len(raw) < 2 or not raw[1] & USER_ID:
        return None
    field = split_properties(raw).get(USER_ID)
    return None if field is None else shortstr_value(field)


def expiration(raw: bytes) -> bytes | None:
    """The ``expiration`` property straight from the encoded properties (None if
    absent), skipping the seven that precede it: asked of every message that
    enters a queue with its flag set, so no pamqp decode."""
    if len(raw) < 2 or not raw[0] & 0x01:  # expiration is flag bit 8 of the first word
        return None
    flags, pos = _property_flags(raw)
    if flags & CONTENT_TYPE:
        pos += 1 + raw[pos]
    if flags & CONTENT_ENCODING:
        pos += 1 + raw[pos]
    if flags & HEADERS:
        pos += 4 + _u32.unpack_from(raw, pos)[0]
    if flags & DELIVERY_MODE:
        pos += 1
    if flags & PRIORITY:
        pos += 1
    if flags & CORRELATION_ID:
        pos += 1 + raw[pos]
    if flags & REPLY_TO:
        pos += 1 + raw[pos]
    return bytes(raw[pos + 1 : pos + 1 + raw[pos]])


# -- field tables ----------------------------------------------------------------------


def parse_table(data: bytes, pos: int = 0) -> list[Entry]:
    """The entries of the (already checked) table at ``pos``, values left raw."""
    end = pos + 4 + _u32.unpack_from(data, pos)[0]
    pos += 4
    entries = []
    while pos < end:
        key_end = pos + 1 + data[pos]
        key = bytes(data[pos + 1 : key_end])
        value_end = _check_field_value(data, key_end, end)
        entries.append((key, bytes(data[key_end:value_end])))
        pos = value_end
    return entries


def parse_array(value: bytes) -> list[bytes]:
    """The raw elements of a raw array value (``A``...)."""
    end = 5 + _u32.unpack_from(value, 1)[0]
    pos = 5
    items = []
    while pos < end:
        item_end = _check_field_value(value, pos, end)
        items.append(value[pos:item_end])
        pos = item_end
    return items


def encode_table(entries: list[Entry]) -> bytes:
    """A table (length word and entries) from raw entries."""
    body = b"".join(bytes((len(key),)) + key + value for key, value in entries)
    return _u32.pack(len(body)) + body


def table(entries: list[Entry]) -> bytes:
    """A raw nested-table value."""
    return b"F" + encode_table(entries)


def array(items: list[bytes]) -> bytes:
    """A raw array value of raw elements."""
    body = b"".join(items)
    return b"A" + _u32.pack(len(body)) + body


def longstr(value: bytes) -> bytes:
    return b"S" + _u32.pack(len(value)) + value


def long(value: int) -> bytes:
    """A signed 64-bit integer (``l``), RabbitMQ's ``long``."""
    return b"l" + _i64.pack(value)


def timestamp(seconds: int) -> bytes:
    return b"T" + _u64.pack(seconds)


def lookup(entries: list[Entry], key: bytes) -> bytes | None:
    """The raw value of the first entry named ``key``, as RabbitMQ's table_lookup."""
    for name, value in entries:
        if name == key:
            return value
    return None


def string_of(value: bytes | None) -> bytes | None:
    """The text of a raw long-string value; None for any other type."""
    if value is None or value[:1] != b"S":
        return None
    return value[5 : 5 + _u32.unpack_from(value, 1)[0]]


def int_of(value: bytes | None) -> int | None:
    """The number in a raw integer value of any width; None for any other type."""
    if value is None or not value:
        return None
    fmt = _INTS.get(value[0])
    if fmt is None:
        return None
    return int(struct.unpack_from(fmt, value, 1)[0])


def term_of(value: bytes | None) -> object:
    """A raw value as RabbitMQ compares it with ``=:=`` after dropping its type:
    strings and byte arrays by their bytes, integers by their number."""
    if value is None:
        return None
    if value[:1] in (b"S", b"x"):
        return value[5 : 5 + _u32.unpack_from(value, 1)[0]]
    number = int_of(value)
    return number if number is not None else ("raw", value)


def set_value(entries: list[Entry], key: bytes, value: bytes) -> list[Entry]:
    """RabbitMQ's set_table_value: replace the first ``key`` (or add it), then sort
    the whole table by key (a stable sort, as Erlang's keysort)."""
    for i, (name, _) in enumerate(entries):
        if name == key:
            entries = [*entries[:i], (key, value), *entries[i + 1 :]]
            break
    else:
        entries = [*entries, (key, value)]
    return sort_table(entries)


def sort_table(entries: list[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda entry: entry[0])


def delete_first(entries: list[Entry], key: bytes) -> list[Entry]:
    """Drop the first entry named ``key`` (Erlang's keydelete)."""
    for i, (name, _) in enumerate(entries):
        if name == key:
            return [*entries[:i], *entries[i + 1 :]]
    return entries
