"""Frame splitting, method decoding through pamqp, and the publish/deliver fast path."""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.base import Frame as Method

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
#: the smallest frame_max a peer may negotiate (spec 4.2.3)
FRAME_MIN_SIZE = 4096
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_frame_head = struct.Struct("!BHI")
_method_id = struct.Struct("!HH")
_header_head = struct.Struct("!HHQ")
_pack_head = _frame_head.pack
_unpack_head = _frame_head.unpack_from
_deliver_tag = struct.Struct("!QB").pack
_u16 = struct.Struct("!H")

#: (class_id, method_id) packed as one big-endian integer, as pamqp indexes methods
BASIC_PUBLISH = 0x003C0028
BASIC_DELIVER_PREFIX = _method_id.pack(60, 60)
BASIC_GET_OK_PREFIX = _method_id.pack(60, 71)
BASIC_RETURN_PREFIX = _method_id.pack(60, 50)


def _echo_names_unchecked(self: Method) -> None:
    """No client-side name rules on methods only a server sends (see below)."""


# pamqp validates names as a client library would: a narrow character set and
# exchange names of at most 127 characters. RabbitMQ accepts any UTF-8 name
# up to 255 bytes, and so does this broker, which must then be able to echo
# such a name back ("café", "jobs{1}"). These four methods only ever go from
# server to client, so no client code in this process constructs them.
for _cls in (
    commands.Queue.DeclareOk,
    commands.Basic.Return,
    commands.Basic.Deliver,
    commands.Basic.GetOk,
):
    _cls.validate = _echo_names_unchecked  # type: ignore[method-assign]


class FrameError(Exception):
    """The byte stream is not a valid frame sequence (reply code 501).

    ``frames`` holds the whole frames that preceded the bad one, so that
    they are still processed before the connection is closed.
    """

    def __init__(self, message: str, frames: list[tuple[int, int, bytes]] | None = None) -> None:
        super().__init__(message)
        self.frames = frames or []


class SyntaxError_(Exception):
    """A frame's fields cannot be decoded (reply code 502)."""


class UnknownMethod(Exception):
    """A method frame names a class/method this server does not know (540)."""


def split_frames(
    buf: bytes | bytearray, pos: int, frame_max: int
) -> tuple[list[tuple[int, int, bytes]], int]:
    """Cut whole frames out of ``buf`` starting at ``pos``.

    Returns ``(frames, new_pos)`` where each frame is ``(type, channel,
    payload)``; an incomplete trailing frame is left for the next call.
    Raises FrameError for a bad frame-end octet or a frame above frame_max.
    """
    frames: list[tuple[int, int, bytes]] = []
    append = frames.append
    n = len(buf)
    while n - pos >= 8:
        ftype, channel, size = _unpack_head(buf, pos)
        if size + 8 > frame_max:
            raise FrameError(f"frame size {size + 8} exceeds frame_max {frame_max}", frames)
        end = pos + 7 + size
        if end >= n:
            break
        if buf[end] != FRAME_END:
            raise FrameError("frame end octet is not 0xCE", frames)
        append((ftype, channel, bytes(buf[pos + 7 : end])))
        pos = end + 1
    return frames, pos


# -- methods ---------------------------------------------------------------


def decode_method(payload: bytes) -> Method:
    """Decode a method frame payload into a pamqp method object."""
    if len(payload) < 4:
        raise SyntaxError_("method frame shorter than its class and method ids")
    index = int.from_bytes(payload[:4], "big")
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise UnknownMethod(f"unknown method class={index >> 16} method={index & 0xFFFF}")
    method = cls.__new__(cls)
    try:
        _unmarshal_strict(method, payload[4:])
    except (SyntaxError_, UnknownMethod):
        raise
    except Exception as exc:  # pamqp raises struct.error, ValueError, UnicodeError, ...
        raise SyntaxError_(f"cannot decode {cls.name}: {exc}") from None
    return method


def _unmarshal_strict(method: Method, data: bytes) -> None:
    """pamqp's unmarshal, but refusing truncated input instead of defaulting."""
    from pamqp import decode

    offset, in_bits = 0, False
    for argument in method.__slots__:
        data_type = method.amqp_type(argument)
        if in_bits and (data_type != "bit" or offset == 8):
            data = data[1:]
            offset = 0
            in_bits = False
        if data_type == "bit":
            if not data:
                raise SyntaxError_(f"{method.name}: truncated bit field {argument}")
            setattr(method, argument, bool(data[0] & (1 << offset)))
            offset += 1
            in_bits = True
            continue
        if not data:
            raise SyntaxError_(f"{method.name}: missing field {argument}")
        if data_type == "table":
            check_field_table(data)
        consumed, value = decode.by_type(data, data_type)
        if consumed > len(data):
            raise SyntaxError_(f"{method.name}: truncated field {argument}")
        setattr(method, argument, value)
        data = data[consumed:]


#: field-value types of tables and arrays (pamqp's set) with a fixed size
_FIELD_SIZES = {
    ord(c): n
    for c, n in (
        ("t", 1),
        ("b", 1),
        ("B", 1),
        ("s", 2),
        ("u", 2),
        ("I", 4),
        ("i", 4),
        ("l", 8),
        ("L", 8),
        ("f", 4),
        ("d", 8),
        ("D", 5),
        ("T", 8),
        ("V", 0),
        ("\x00", 0),
    )
}
_u32 = struct.Struct("!I").unpack_from


def check_field_table(data: bytes, pos: int = 0) -> int:
    """Walk the field table at ``pos`` strictly; returns the position just after it.

    pamqp decodes tables leniently (a key or string running past the table's
    declared end is cut short, a missing value becomes void), so every table
    is checked first: each entry must lie inside the table and end exactly at
    its end, as RabbitMQ requires. Raises SyntaxError_ (502).
    """
    if len(data) - pos < 4:
        raise SyntaxError_("truncated field table length")
    end = pos + 4 + _u32(data, pos)[0]
    if end > len(data):
        raise SyntaxError_("field table longer than its frame")
    pos += 4
    while pos < end:
        pos += 1 + data[pos]  # the key, a short string
        if pos >= end:
            raise SyntaxError_("field table entry runs past the end of the table")
        pos = _check_field_value(data, pos, end)
    return end


def _check_field_value(data: bytes, pos: int, end: int) -> int:
    kind = data[pos]
    pos += 1
    size = _FIELD_SIZES.get(kind)
    if size is not None:
        pos += size
    elif kind in (0x53, 0x78):  # S long string, x byte array
        if pos + 4 > end:
            raise SyntaxError_("truncated field value length")
        pos += 4 + _u32(data, pos)[0]
    elif kind == 0x46:  # F nested table
        if pos + 4 > end:
            raise SyntaxError_("truncated field table length")
        pos = check_field_table(data, pos)
    elif kind == 0x41:  # A array
        if pos + 4 > end:
            raise SyntaxError_("truncated field array length")
        array_end = pos + 4 + _u32(data, pos)[0]
        if array_end > end:
            raise SyntaxError_("field array longer than its table")
        pos += 4
        while pos < array_end:
            pos = _check_field_value(data, pos, array_end)
    else:
        raise SyntaxError_(f"unknown field value type {chr(kind)!r}")
    if pos > end:
        raise SyntaxError_("field value runs past the end of its table")
    return pos


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    """One frame around ``payload`` (a split frame put back into bytes)."""
    return _pack_head(ftype, channel, len(payload)) + payload + FRAME_END_BYTE


def method_frame(channel: int, method: Method) -> bytes:
    """Encode a pamqp method object as a complete method frame."""
    payload = _method_id.pack(method.index >> 16, method.index & 0xFFFF) + method.marshal()
    return _pack_head(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def renamed_queue(payload: bytes, name: str) -> bytes:
    """A queue-class method payload (ticket, then the queue name) naming another
    queue: the server named it, or the client left it empty for the last one.
    Editing the client's bytes keeps the rest exactly as sent (pamqp cannot
    re-encode every table a client may send, e.g. small negative integers)."""
    old = payload[6]
    return payload[:6] + shortstr(name) + payload[7 + old :]


def open_ok_frame(known_hosts: str) -> bytes:
    """connection.open-ok with its known-hosts field filled in (servers a client may
    reconnect to). pamqp refuses to build a non-empty one (0-9-1 marks the field
    reserved), but every client decodes it as the short string it is."""
    payload = _method_id.pack(10, 41) + shortstr(known_hosts)
    return _pack_head(FRAME_METHOD, 0, len(payload)) + payload + FRAME_END_BYTE


# -- the hot path ----------------------------------------------------------


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool]:
    """Decode basic.publish without pamqp: (exchange, routing_key, mandatory, immediate)."""
    try:
        pos = 6  # class, method, reserved-1
        n = payload[pos]
        exchange = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        n = payload[pos]
        routing_key = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        bits = payload[pos]
    except (IndexError, UnicodeDecodeError) as exc:
        raise SyntaxError_(f"cannot decode basic.publish: {exc}") from None
    if pos + 1 != len(payload):
        raise SyntaxError_("basic.publish has trailing bytes")
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_header(payload: bytes) -> tuple[int, int, bytes]:
    """Decode a content header: (class_id, body_size, raw property flags and list).

    The property bytes stay encoded: most messages are delivered without
    anyone reading their properties, so they are decoded only on demand.
    """
    if len(payload) < 14:
        raise SyntaxError_("content header frame too short")
    class_id, _weight, body_size = _header_head.unpack_from(payload)
    props = payload[12:]
    if props not in _checked_properties:
        check_properties(props)
        if len(props) <= 256:  # small ones only: the cache stays under 1 MB
            if len(_checked_properties) >= 4096:
                _checked_properties.clear()
            _checked_properties[props] = None
    return class_id, body_size, props


#: property lists already checked: publishers tend to repeat theirs
_checked_properties: dict[bytes, None] = {b"\x00\x00": None}


#: (flag, type) of each basic property in wire order: s shortstr, o octet, t timestamp, F table
_PROPERTY_LAYOUT = tuple(
    (
        commands.Basic.Properties.flags[name],
        {"shortstr": "s", "octet": "o", "timestamp": "t", "table": "F"}[
            getattr(commands.Basic.Properties, "_" + name)
        ],
    )
    for name in commands.Basic.Properties.__slots__
)


def _property_flags(raw: bytes) -> tuple[int, int]:
    """The property flag words of a content header: (flags, offset of the first value)."""
    flags, pos, word = 0, 0, 0
    while True:
        (part,) = _u16.unpack_from(raw, pos)
        pos += 2
        flags |= (part & 0xFFFE) << (16 * word)
        if not part & 1:
            return flags, pos
        word += 1


def delivery_mode(raw: bytes) -> int:
    """The delivery-mode property (2: persistent) straight from the encoded
    properties, skipping the three that precede it; 0 if absent. The store asks
    it of every message entering a durable queue, so no pamqp decode."""
    if len(raw) < 2 or not raw[0] & 0x10:  # delivery-mode is flag bit 12 of the first word
        return 0
    flags, pos = _property_flags(raw)
    if flags & 0x8000:  # content-type
        pos += 1 + raw[pos]
    if flags & 0x4000:  # content-encoding
        pos += 1 + raw[pos]
    if flags & 0x2000:  # headers (a table: u32 length)
        pos += 4 + int.from_bytes(raw[pos : pos + 4], "big")
    return raw[pos] if pos < len(raw) else 0


def check_properties(raw: bytes) -> None:
    """Refuse a property list that decode_properties could not decode (502).

    Properties stay encoded until someone needs them, possibly while serving
    another connection (routing, expiry, a consumer's client library): a
    message is only accepted if that later decode cannot fail. Cheaper than
    decoding: no pamqp objects unless there is a header table.
    """
    try:
        flags, pos = _property_flags(raw)
        end = len(raw)
        flags &= 0xFFFC  # bits past the last basic property are ignored, as pamqp does
        for flag, kind in _PROPERTY_LAYOUT:
            if not flags & flag:
                if not flags:
                    break
                continue
            flags ^= flag
            if kind == "s":
                n = raw[pos]
                raw[pos + 1 : pos + 1 + n].decode()
                pos += 1 + n
            elif kind == "o":
                pos += 1
            elif kind == "t":
                pos += 8
            else:
                from pamqp import decode

                check_field_table(raw, pos)
                consumed, _ = decode.field_table(raw[pos:])  # keys must be UTF-8
                pos += consumed
            if pos > end:
                raise SyntaxError_("truncated content properties")
    except SyntaxError_:
        raise
    except Exception as exc:
        raise SyntaxError_(f"cannot decode content properties: {exc}") from None


def decode_properties(raw: bytes) -> commands.Basic.Properties:
    """Decode the raw property bytes of a content header into Basic.Properties."""
    from pamqp import decode

    props = commands.Basic.Properties()
    try:
        flags, pos = _property_flags(raw)
        data = raw[pos:]
        for name in props.__slots__:
            if flags & props.flags[name]:
                kind = getattr(props.__class__, "_" + name)
                if kind == "timestamp" and len(data) >= 8:
                    # any 64-bit value is legal on the wire (RabbitMQ passes it on);
                    # one that a datetime cannot hold is left out, not an error
                    try:
                        consumed, value = decode.timestamp(data)
                    except (ValueError, OverflowError, OSError):
                        consumed, value = 8, None
                else:
                    if kind == "table":
                        check_field_table(data)
                    consumed, value = decode.by_type(data, kind)
                if consumed > len(data):
                    raise SyntaxError_(f"truncated property {name}")
                setattr(props, name, value)
                data = data[consumed:]
    except SyntaxError_:
        raise
    except Exception as exc:
        raise SyntaxError_(f"cannot decode content properties: {exc}") from None
    return props


def encode_properties(props: commands.Basic.Properties | None) -> bytes:
    """Encode Basic.Properties as the raw flags-and-list bytes of a content header."""
    if props is None:
        return b"\x00\x00"
    return props.marshal()


def content_frames(channel: int, props_raw: bytes, body: bytes, frame_max: int) -> bytes:
    """The content header frame and as many body frames as frame_max requires."""
    header = _header_head.pack(60, 0, len(body)) + props_raw
    parts = [_pack_head(FRAME_HEADER, channel, len(header)), header, FRAME_END_BYTE]
    chunk = frame_max - 8
    if len(body) <= chunk:
        if body:
            parts += (_pack_head(FRAME_BODY, channel, len(body)), body, FRAME_END_BYTE)
    else:
        for start in range(0, len(body), chunk):
            piece = body[start : start + chunk]
            parts += (_pack_head(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTE)
    return b"".join(parts)


#: bodies up to this size are copied into their frames (one bytes object, cached per
#: message); larger ones are sent as buffers over the body (``content_parts``)
INLINE_BODY = 64 * 1024


def content_parts(
    channel: int, props_raw: bytes, body: bytes | bytearray | memoryview, frame_max: int
) -> list[bytes | memoryview]:
    """The content frames as a list of buffers: small frame heads and ends as
    ``bytes``, each body frame's payload a ``memoryview`` slice of ``body``.

    A large body is never copied to be sent: the transport keeps the views
    until the socket took them (``transport.writelines``)."""
    size = len(body)
    header = _header_head.pack(60, 0, size) + props_raw
    prefix = _pack_head(FRAME_HEADER, channel, len(header)) + header + FRAME_END_BYTE
    view = body if isinstance(body, memoryview) else memoryview(body)
    chunk = frame_max - 8
    parts: list[bytes | memoryview] = []
    for start in range(0, size, chunk):
        end = min(start + chunk, size)
        parts.append(prefix + _pack_head(FRAME_BODY, channel, end - start))
        parts.append(view[start:end])
        prefix = FRAME_END_BYTE
    parts.append(prefix)
    return parts


def shortstr(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError("short string longer than 255 bytes")
    return bytes((len(raw),)) + raw


def deliver_frame(
    channel: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool, tail: bytes
) -> bytes:
    """basic.deliver as a frame; ``tail`` is the encoded exchange and routing key.

    ``consumer_tag_raw`` is the consumer tag already encoded as a short string,
    so a delivery costs one struct pack and a join.
    """
    size = 4 + len(consumer_tag_raw) + 9 + len(tail)
    return b"".join(
        (
            _pack_head(FRAME_METHOD, channel, size),
            BASIC_DELIVER_PREFIX,
            consumer_tag_raw,
            _deliver_tag(delivery_tag, redelivered),
            tail,
            FRAME_END_BYTE,
        )
    )


_confirm = struct.Struct("!BHIHHQB").pack


def confirm_frame(channel: int, delivery_tag: int, multiple: bool, ack: bool = True) -> bytes:
    """basic.ack (or basic.nack, requeue off) from the server, without pamqp: a busy
    publisher gets one per read or per settled batch."""
    method = 80 if ack else 120
    return _confirm(FRAME_METHOD, channel, 13, 60, method, delivery_tag, multiple) + FRAME_END_BYTE


def routing_tail(exchange: str, routing_key: str) -> bytes:
    """The exchange and routing key as two short strings (end of deliver/get-ok)."""
    return shortstr(exchange) + shortstr(routing_key)
