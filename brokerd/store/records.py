"""Journal records: the bytes a queue's journal is made of (pure, no I/O).

Every record is framed as

    u32 length | u32 crc32 | payload (length bytes)

with the CRC over the payload, so a record cut short by a crash (a *torn*
tail: the length says more than the file holds, or the CRC does not match)
is recognised and dropped on recovery. The payload starts with a type byte:

    ENQUEUE   u8 1 | u64 id | u8 flags | u16 len exchange | u16 len routing key
              | u32 len properties | u32 len body | exchange | routing key
              | properties | body
    ACQUIRE   u8 2 | u64 id          delivered, not yet settled
    DEQUEUE   u8 3 | u64 id          acked, rejected, purged: gone for good
    REQUEUE   u8 4 | u64 id          back in the queue (keeps its redelivered mark)

``flags`` bit 0: the message is persistent (delivery mode 2); bit 1: it was
delivered before (redelivered). A transient message is journalled only when
its queue pages bodies out to disk; recovery drops it.
"""

from __future__ import annotations

import struct
import zlib

try:  # zlib-ng's CRC-32 (the same checksum, SIMD): 4-14x faster on bodies of 1-64 KiB
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - a platform without the wheel
    crc32 = zlib.crc32
from dataclasses import dataclass

ENQUEUE = 1
ACQUIRE = 2
DEQUEUE = 3
REQUEUE = 4

PERSISTENT = 1
REDELIVERED = 2

HEADER = struct.Struct("!II")
_enqueue_head = struct.Struct("!BQBHHII")
_ref = struct.Struct("!BQ")
#: a record's framing, type and id at once: the fast test of a body read back
RECORD_START = struct.Struct("!IIBQ")
#: a record longer than this is corruption, not a message (bodies are capped far lower)
MAX_RECORD = 1 << 31


class JournalError(ValueError):
    """A journal that cannot be read past a point (a torn or corrupt record)."""


@dataclass(slots=True)
class Enqueue:
    id: int
    flags: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    #: where the body starts in the segment, for reading it back when paged out
    body_offset: int = 0

    @property
    def persistent(self) -> bool:
        return bool(self.flags & PERSISTENT)


@dataclass(slots=True)
class Ref:
    """ACQUIRE, DEQUEUE or REQUEUE of one message."""

    kind: int
    id: int


Record = Enqueue | Ref


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload), crc32(payload)) + payload


def enqueue_parts(
    id: int, flags: int, exchange: str, routing_key: str, props: bytes, body: bytes
) -> tuple[bytes, bytes]:
    """An ENQUEUE record as (everything before the body, the body): a large body is
    written from its own buffer, never copied into the record."""
    ex, rk = exchange.encode(), routing_key.encode()
    head = _enqueue_head.pack(ENQUEUE, id, flags, len(ex), len(rk), len(props), len(body))
    head += ex + rk + props
    crc = crc32(body, crc32(head))
    return HEADER.pack(len(head) + len(body), crc) + head, body


def enqueue_head_size(exchange: str, routing_key: str, props: bytes) -> int:
    """Bytes before the body in an ENQUEUE record (its framing included)."""
    return (
        HEADER.size
        + _enqueue_head.size
        + len(exchange.encode())
        + len(routing_key.encode())
        + len(props)
    )


def check_enqueue(data: bytes, id: int, length: int) -> str | None:
    """Why ``data`` (read back from where message ``id``'s ENQUEUE record of
    ``length`` bytes was written) is not that record, or None if it is: the read
    is whole, the framing's length and CRC match, and the type and id are right.
    Zeros (a region the committer has not reached) fail the length test."""
    if len(data) != length:
        return f"short read ({len(data)} of {length} bytes)"
    if length < HEADER.size + _enqueue_head.size:
        return "too short for an enqueue record"
    size, crc = HEADER.unpack_from(data)
    if size != length - HEADER.size:
        return f"has length {size}, not {length - HEADER.size}"
    if crc32(memoryview(data)[HEADER.size :]) != crc:
        return "fails its CRC"
    kind, found, *_ = _enqueue_head.unpack_from(data, HEADER.size)
    if kind != ENQUEUE or found != id:
        return f"is a type {kind} record of message {found}"
    return None


def ref(kind: int, id: int) -> bytes:
    return frame(_ref.pack(kind, id))


def decode_payload(payload: bytes, offset: int = 0) -> Record:
    """One record's payload; ``offset`` is where the payload starts in its segment."""
    kind = payload[0] if payload else 0
    if kind == ENQUEUE:
        if len(payload) < _enqueue_head.size:
            raise JournalError("enqueue record too short")
        _k, id, flags, lex, lrk, lprops, lbody = _enqueue_head.unpack_from(payload)
        pos = _enqueue_head.size
        if pos + lex + lrk + lprops + lbody != len(payload):
            raise JournalError("enqueue record lengths do not add up")
        exchange = payload[pos : pos + lex].decode()
        pos += lex
        routing_key = payload[pos : pos + lrk].decode()
        pos += lrk
        props = payload[pos : pos + lprops]
        pos += lprops
        return Enqueue(id, flags, exchange, routing_key, props, payload[pos:], offset + pos)
    if kind in (ACQUIRE, DEQUEUE, REQUEUE):
        if len(payload) != _ref.size:
            raise JournalError("reference record of the wrong size")
        _k, id = _ref.unpack(payload)
        return Ref(kind, id)
    raise JournalError(f"unknown journal record type {kind}")


#: what ``scan_fast`` yields for a record: (kind, id, record offset, record length,
#: flags, exchange, routing key, properties, body offset); the last five only for
#: ENQUEUE (else 0, "", "", b"", 0)
Raw = tuple[int, int, int, int, int, str, str, bytes, int]


def scan_fast(data: bytes, start: int = 0) -> tuple[list[Raw], int, str | None]:
    """``scan`` for recovery: tuples straight from the segment buffer, no objects per
    field and no copy but the strings and properties a message keeps (not its body:
    recovery reads back only the bodies it keeps in memory)."""
    out: list[Raw] = []
    append = out.append
    view = memoryview(data)
    head_unpack = HEADER.unpack_from
    enq_unpack = _enqueue_head.unpack_from
    ref_unpack = _ref.unpack_from
    pos = start
    end = len(data)
    while pos < end:
        if end - pos < HEADER.size:
            return out, pos, f"torn record header at {pos}"
        length, crc = head_unpack(data, pos)
        start = pos + HEADER.size
        if length == 0 and crc == 0:
            return out, pos, None
        stop = start + length
        if length > MAX_RECORD or stop > end:
            return out, pos, f"torn record at {pos} (length {length}, {end - start} left)"
        if crc32(view[start:stop]) != crc:
            return out, pos, f"record at {pos} fails its CRC"
        kind = data[start]
        if kind == ENQUEUE and length >= _enqueue_head.size:
            _k, id, flags, lex, lrk, lprops, lbody = enq_unpack(data, start)
            p = start + _enqueue_head.size
            if p + lex + lrk + lprops + lbody != stop:
                return out, pos, f"record at {pos} is unreadable: lengths do not add up"
            try:
                exchange = data[p : p + lex].decode()
                routing_key = data[p + lex : p + lex + lrk].decode()
            except UnicodeDecodeError:
                return out, pos, f"record at {pos} is unreadable: not UTF-8"
            p += lex + lrk
            props = data[p : p + lprops]
            p += lprops
            append((kind, id, pos, stop - pos, flags, exchange, routing_key, props, p))
        elif kind in (ACQUIRE, DEQUEUE, REQUEUE) and length == _ref.size:
            append((kind, ref_unpack(data, start)[1], pos, stop - pos, 0, "", "", b"", 0))
        else:
            return out, pos, f"record at {pos} is unreadable: type {kind}, length {length}"
        pos = stop
    return out, pos, None


def damaged_end(data: bytes, pos: int) -> int | None:
    """Where a record at ``pos`` that failed its check ends, if an intact record
    follows it (so it was damaged in place, not torn by a crash: a torn record is
    the last one written, followed by the segment's zeros); None otherwise."""
    if len(data) - pos < HEADER.size:
        return None
    length, _crc = HEADER.unpack_from(data, pos)
    following = pos + HEADER.size + length
    if length > MAX_RECORD or following + HEADER.size > len(data):
        return None
    size, crc = HEADER.unpack_from(data, following)
    stop = following + HEADER.size + size
    if size == 0 or size > MAX_RECORD or stop > len(data):
        return None
    if crc32(memoryview(data)[following + HEADER.size : stop]) != crc:
        return None
    return following


def record_id(data: bytes) -> int | None:
    """The message id a (possibly damaged) record claims, for the log; None if it
    does not even look like one."""
    if len(data) < HEADER.size + _ref.size or data[HEADER.size] not in (
        ENQUEUE,
        ACQUIRE,
        DEQUEUE,
        REQUEUE,
    ):
        return None
    return int(_ref.unpack_from(data, HEADER.size)[1])


def starts(data: bytes | memoryview, count: int, start: int = 0) -> list[int]:
    """Where each of the first ``count`` records begins (their lengths chain them)."""
    out = []
    pos = start
    for _ in range(count):
        out.append(pos)
        (length,) = struct.unpack_from("!I", data, pos)
        pos += HEADER.size + length
    return out


def scan(data: bytes | memoryview, start: int = 0) -> tuple[list[Record], int, str | None]:
    """Every whole, intact record of a segment from ``start``; returns the records,
    where the intact part ends, and why reading stopped early (None: at the end)."""
    view = memoryview(data)
    out: list[Record] = []
    pos = start
    end = len(view)
    while pos < end:
        if end - pos < HEADER.size:
            return out, pos, f"torn record header at {pos}"
        length, crc = HEADER.unpack_from(view, pos)
        body_start = pos + HEADER.size
        if length == 0 and crc == 0:
            return out, pos, None  # preallocated zeros: the end of what was written
        if length > MAX_RECORD or body_start + length > end:
            return out, pos, f"torn record at {pos} (length {length}, {end - body_start} left)"
        payload = view[body_start : body_start + length]
        if crc32(payload) != crc:
            return out, pos, f"record at {pos} fails its CRC"
        try:
            out.append(decode_payload(bytes(payload), body_start))
        except (JournalError, UnicodeDecodeError) as exc:
            return out, pos, f"record at {pos} is unreadable: {exc}"
        pos = body_start + length
    return out, pos, None
