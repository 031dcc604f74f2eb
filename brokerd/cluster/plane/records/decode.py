"""Bytes into records: one link message, checked as it is read (a malformed or
truncated batch is a ``RecordError``, never a crash); the hot records (deliveries,
forwards, replication events) take a fast path."""

from __future__ import annotations

import struct

from brokerd.cluster.plane.records.kinds import (
    ACK,
    CANCEL,
    CONSUME,
    CREDIT,
    DELIVER,
    DRAINED,
    FORWARD,
    GET,
    GOT,
    MAGIC,
    PURGE,
    R_ENQUEUE,
    R_SYNC,
    REJECT,
    REPLICATE,
    REPLICATED,
    REPLY,
    SESSION,
    SETTLE,
    STAT,
    VOID,
    Ack,
    Cancel,
    Consume,
    Credit,
    Deliver,
    Drained,
    Forward,
    Get,
    Got,
    Purge,
    Record,
    RecordError,
    Reject,
    Replicate,
    Replicated,
    Reply,
    Session,
    Settle,
    Stat,
    Void,
    _u16,
    _u32,
    _u64,
)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _need(self, n: int) -> int:
        pos = self.pos
        if pos + n > len(self.data):
            raise RecordError("truncated record")
        self.pos = pos + n
        return pos

    def u8(self) -> int:
        return self.data[self._need(1)]

    def u16(self) -> int:
        return _u16.unpack_from(self.data, self._need(2))[0]

    def u32(self) -> int:
        return _u32.unpack_from(self.data, self._need(4))[0]

    def u64(self) -> int:
        return _u64.unpack_from(self.data, self._need(8))[0]

    def s(self) -> str:
        n = self.u16()
        pos = self._need(n)
        try:
            return self.data[pos : pos + n].decode()
        except UnicodeDecodeError:
            raise RecordError("string is not UTF-8") from None

    def b(self) -> bytes:
        n = self.u32()
        pos = self._need(n)
        return self.data[pos : pos + n]

    def ids(self) -> list[int]:
        n = self.u32()
        pos = self._need(8 * n)
        return list(struct.unpack_from(f"!{n}Q", self.data, pos))


_u16_at = _u16.unpack_from
_u32_at = _u32.unpack_from
_deliver_at = struct.Struct("!QB").unpack_from
_forward_at = struct.Struct("!BQ").unpack_from


def _content_at(data: bytes, p: int) -> tuple[str, str, bytes, bytes, int]:
    """The exchange, routing key, properties and body that end a ``Deliver``, a
    ``Forward`` and a ``Replicate`` of a message, and the position after them."""
    (n,) = _u16_at(data, p)
    p += 2
    exchange = data[p : p + n].decode()
    p += n
    (n,) = _u16_at(data, p)
    p += 2
    routing_key = data[p : p + n].decode()
    p += n
    (n,) = _u32_at(data, p)
    p += 4
    props = data[p : p + n]
    p += n
    (n,) = _u32_at(data, p)
    p += 4
    body = data[p : p + n]
    p += n
    return exchange, routing_key, props, body, p


def _deliver_fast(data: bytes, p: int) -> tuple[Deliver, int]:
    """A ``Deliver`` record (after its type byte), without a method call per field:
    deliveries are most of what a consumer's server reads."""
    (n,) = _u16_at(data, p)
    p += 2
    tag = data[p : p + n].decode()
    p += n
    delivery, redelivered = _deliver_at(data, p)
    p += 9
    exchange, routing_key, props, body, p = _content_at(data, p)
    return Deliver(tag, delivery, bool(redelivered), exchange, routing_key, props, body), p


def _forward_fast(data: bytes, p: int) -> tuple[Forward, int]:
    """A ``Forward`` record (after its type byte): most of what the root reads."""
    redelivered, seq = _forward_at(data, p)
    p += 9
    (n,) = _u16_at(data, p)
    p += 2
    cluster_id = data[p : p + n].decode()
    p += n
    (count,) = _u16_at(data, p)
    p += 2
    targets = []
    for _ in range(count):
        (n,) = _u16_at(data, p)
        p += 2
        spid = data[p : p + n].decode()
        p += n
        (n,) = _u16_at(data, p)
        p += 2
        targets.append((spid, data[p : p + n].decode()))
        p += n
    exchange, routing_key, props, body, p = _content_at(data, p)
    record = Forward(seq, cluster_id, targets, exchange, routing_key, props, body)
    record.redelivered = bool(redelivered)
    return record, p


def decode(data: bytes) -> list[Record]:
    """Every record of one link message, in order; RecordError if malformed."""
    if data[:4] != MAGIC:
        raise RecordError("not a record batch")
    try:
        return _decode(data)
    except (struct.error, IndexError):
        raise RecordError("truncated record") from None
    except UnicodeDecodeError:
        raise RecordError("string is not UTF-8") from None


_replicate_at = struct.Struct("!QBQB").unpack_from


def _replicate_fast(data: bytes, p: int) -> tuple[Replicate, int]:
    """A ``Replicate`` record (after its type byte): most of what a replica reads."""
    seq, op, mid, flags = _replicate_at(data, p)
    p += 18
    (n,) = _u16_at(data, p)
    p += 2
    queue = data[p : p + n].decode()
    p += n
    if op != R_ENQUEUE and op != R_SYNC:
        return Replicate(seq, op, queue, mid, flags), p
    exchange, routing_key, props, body, p = _content_at(data, p)
    return Replicate(seq, op, queue, mid, flags, exchange, routing_key, props, body), p


_FAST = {DELIVER: _deliver_fast, FORWARD: _forward_fast, REPLICATE: _replicate_fast}


def _decode(data: bytes) -> list[Record]:
    r = _Reader(data)
    r.pos = 4
    out: list[Record] = []
    end = len(data)
    while r.pos < end:
        kind = r.u8()
        fast = _FAST.get(kind)
        if fast is not None:  # the hot records
            record, r.pos = fast(data, r.pos)
            if r.pos > end:
                raise RecordError("truncated record")
            out.append(record)
        elif kind == SETTLE:
            first, last, ok, routed = r.u64(), r.u64(), r.u8(), r.u32()
            if last < first:
                raise RecordError("settle range ends before it starts")
            out.append(Settle(first, last, bool(ok), routed))
        elif kind == CONSUME:
            req, tag, queue, window, flags = r.u64(), r.s(), r.s(), r.u32(), r.u8()
            out.append(
                Consume(
                    req,
                    tag,
                    queue,
                    window,
                    bool(flags & 1),
                    bool(flags & 2),
                    bool(flags & 4),
                    r.s(),
                )
            )
        elif kind == CANCEL:
            out.append(Cancel(r.s()))
        elif kind == GET:
            out.append(Get(r.u64(), r.s(), bool(r.u8())))
        elif kind == ACK:
            out.append(Ack(r.ids()))
        elif kind == REJECT:
            requeue = bool(r.u8())
            out.append(Reject(r.ids(), requeue))
        elif kind == CREDIT:
            out.append(Credit(r.s(), r.u32()))
        elif kind == PURGE:
            out.append(Purge(r.u64(), r.s()))
        elif kind == STAT:
            out.append(Stat(r.u64(), r.s()))
        elif kind == REPLY:
            hard = bool(r.u8())
            out.append(Reply(r.u64(), r.u16(), r.s(), r.u32(), r.u32(), hard))
        elif kind == GOT:
            out.append(Got(r.u64(), r.u64(), bool(r.u8()), r.u32(), r.s(), r.s(), r.b(), r.b()))
        elif kind == SESSION:
            out.append(Session(r.u64()))
        elif kind == VOID:
            out.append(Void(r.u64()))
        elif kind == DRAINED:
            out.append(Drained(r.s(), r.u64()))
        elif kind == REPLICATED:
            out.append(Replicated(r.u64()))
        else:
            raise RecordError(f"unknown record type {kind}")
    return out
