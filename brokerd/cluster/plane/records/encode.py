"""Records into bytes: ``Batch`` gathers a link message's records, ``replicate_parts``
encodes a replication event without copying its body (pure, no I/O).

Layout: ``RKD1`` then records; each record is one type byte and its fields.
Strings are UTF-8 with a u16 length, byte blobs (properties, bodies) a u32
length, ids u64, counts u32.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

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
    Settle,
    Stat,
    Void,
    _replicate_head,
    _settle,
    _u16,
    _u32,
    _u64,
)

if TYPE_CHECKING:
    from brokerd.model.message import Body


def _s(text: str) -> bytes:
    encoded = _STRINGS.get(text)
    if encoded is not None:
        return encoded
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise RecordError(f"string of {len(raw)} bytes is too long for a record")
    encoded = _u16.pack(len(raw)) + raw
    if len(raw) <= 255:
        if len(_STRINGS) >= _STRINGS_MAX:
            _STRINGS.clear()  # a crude bound: names repeat, a flood of new ones starts over
        _STRINGS[text] = encoded
    return encoded


#: encoded short strings (queue and exchange names, routing keys repeat in every
#: record of a stream): bounded, cleared when full
_STRINGS: dict[str, bytes] = {}
_STRINGS_MAX = 4096


def _b(blob: bytes) -> bytes:
    return _u32.pack(len(blob)) + blob


class Batch:
    """Records being gathered for one link message; ``take()`` empties it.

    Consecutive acks are folded into one ``Ack`` record (a consumer acking one
    message at a time would otherwise cost a record per message)."""

    __slots__ = ("_acks", "_parts", "size")

    def __init__(self) -> None:
        self._parts: list[bytes | Body] = []
        self._acks: list[int] = []
        self.size = 0

    def __bool__(self) -> bool:
        return bool(self._parts or self._acks)

    def _add(self, *parts: bytes | Body) -> None:
        if self._acks:
            self._emit_acks()
        self._parts.extend(parts)
        self.size += sum(map(len, parts))

    def _emit_acks(self) -> None:
        ids, self._acks = self._acks, []
        raw = bytes((ACK,)) + _u32.pack(len(ids)) + struct.pack(f"!{len(ids)}Q", *ids)
        self._parts.append(raw)
        self.size += len(raw) - 8 * len(ids)  # the ids were counted as they came

    def take(self) -> bytes:
        return b"".join([MAGIC, *self.cut()])

    def cut(self) -> list[bytes | Body]:
        """The records gathered so far, as parts of a later ``joined`` link message."""
        if self._acks:
            self._emit_acks()
        parts, self._parts = self._parts, []
        self.size = 0
        return parts

    def forward(
        self,
        seq: int,
        cluster_id: str,
        targets: list[tuple[str, str]],
        exchange: str,
        routing_key: str,
        props: bytes,
        body: Body,  # bytes-like: a large body is a read-only view
        redelivered: bool = False,
    ) -> None:
        head = [
            bytes((FORWARD, int(redelivered))),
            _u64.pack(seq),
            _s(cluster_id),
            _u16.pack(len(targets)),
        ]
        for spid, queue in targets:
            head += (_s(spid), _s(queue))
        head += (_s(exchange), _s(routing_key), _b(props), _u32.pack(len(body)))
        self._add(b"".join(head), body)

    def settle(self, first: int, last: int, ok: bool, routed: int) -> None:
        self._add(_settle.pack(SETTLE, first, last, int(ok), routed))

    def consume(self, r: Consume) -> None:
        flags = int(r.no_ack) | int(r.exclusive) << 1 | int(r.no_local) << 2
        self._add(
            bytes((CONSUME,)),
            _u64.pack(r.req),
            _s(r.tag),
            _s(r.queue),
            _u32.pack(r.window),
            bytes((flags,)),
            _s(r.origin),
        )

    def cancel(self, tag: str) -> None:
        self._add(bytes((CANCEL,)), _s(tag))

    def get(self, req: int, queue: str, no_ack: bool) -> None:
        self._add(bytes((GET,)), _u64.pack(req), _s(queue), bytes((int(no_ack),)))

    def ack(self, ids: list[int]) -> None:
        self._acks.extend(ids)
        self.size += 8 * len(ids)

    def reject(self, ids: list[int], requeue: bool) -> None:
        self._add(
            bytes((REJECT, int(requeue))),
            _u32.pack(len(ids)),
            struct.pack(f"!{len(ids)}Q", *ids),
        )

    def credit(self, tag: str, count: int) -> None:
        self._add(bytes((CREDIT,)), _s(tag), _u32.pack(count))

    def purge(self, req: int, queue: str) -> None:
        self._add(bytes((PURGE,)), _u64.pack(req), _s(queue))

    def stat(self, req: int, queue: str) -> None:
        self._add(bytes((STAT,)), _u64.pack(req), _s(queue))

    def reply(
        self, req: int, code: int, text: str = "", a: int = 0, b: int = 0, hard: bool = False
    ) -> None:
        self._add(
            bytes((REPLY, int(hard))),
            _u64.pack(req),
            _u16.pack(code),
            _s(text),
            _u32.pack(a),
            _u32.pack(b),
        )

    def deliver(
        self,
        tag: str,
        delivery: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        props: bytes,
        body: Body,  # bytes-like: a large body is a read-only view
    ) -> None:
        head = b"".join(
            (
                bytes((DELIVER,)),
                _s(tag),
                _u64.pack(delivery),
                bytes((int(redelivered),)),
                _s(exchange),
                _s(routing_key),
                _b(props),
                _u32.pack(len(body)),
            )
        )
        self._add(head, body)

    def got(
        self,
        req: int,
        delivery: int,
        redelivered: bool,
        remaining: int,
        exchange: str,
        routing_key: str,
        props: bytes,
        body: Body,  # bytes-like: a large body is a read-only view
    ) -> None:
        head = b"".join(
            (
                bytes((GOT,)),
                _u64.pack(req),
                _u64.pack(delivery),
                bytes((int(redelivered),)),
                _u32.pack(remaining),
                _s(exchange),
                _s(routing_key),
                _b(props),
                _u32.pack(len(body)),
            )
        )
        self._add(head, body)

    def session(self, epoch: int) -> None:
        self._add(bytes((SESSION,)), _u64.pack(epoch))

    def void(self, epoch: int) -> None:
        self._add(bytes((VOID,)), _u64.pack(epoch))

    def drained(self, queue: str, epoch: int) -> None:
        self._add(bytes((DRAINED,)), _s(queue), _u64.pack(epoch))

    def replicate(
        self,
        seq: int,
        op: int,
        queue: str,
        mid: int,
        flags: int = 0,
        exchange: str = "",
        routing_key: str = "",
        props: bytes = b"",
        body: bytes = b"",
    ) -> None:
        self._add(*replicate_parts(seq, op, queue, mid, flags, exchange, routing_key, props, body))

    def add_parts(self, parts: tuple[bytes | Body, ...], size: int) -> None:
        """A record encoded once for several batches (``replicate_parts``), and its
        size (counted once too)."""
        if self._acks:
            self._emit_acks()
        self._parts.extend(parts)
        self.size += size

    def replicated(self, seq: int) -> None:
        self._add(bytes((REPLICATED,)), _u64.pack(seq))

    def record(self, r: Record) -> None:
        """Any record object (tests and relays); the typed methods above are faster."""
        if isinstance(r, Forward):
            self.forward(
                r.seq,
                r.cluster_id,
                r.targets,
                r.exchange,
                r.routing_key,
                r.props,
                r.body,
                r.redelivered,
            )
        elif isinstance(r, Settle):
            self.settle(r.first, r.last, r.ok, r.routed)
        elif isinstance(r, Consume):
            self.consume(r)
        elif isinstance(r, Cancel):
            self.cancel(r.tag)
        elif isinstance(r, Get):
            self.get(r.req, r.queue, r.no_ack)
        elif isinstance(r, Ack):
            self.ack(r.ids)
        elif isinstance(r, Reject):
            self.reject(r.ids, r.requeue)
        elif isinstance(r, Credit):
            self.credit(r.tag, r.count)
        elif isinstance(r, Purge):
            self.purge(r.req, r.queue)
        elif isinstance(r, Stat):
            self.stat(r.req, r.queue)
        elif isinstance(r, Reply):
            self.reply(r.req, r.code, r.text, r.a, r.b, r.hard)
        elif isinstance(r, Deliver):
            self.deliver(
                r.tag, r.delivery, r.redelivered, r.exchange, r.routing_key, r.props, r.body
            )
        elif isinstance(r, Got):
            self.got(
                r.req,
                r.delivery,
                r.redelivered,
                r.remaining,
                r.exchange,
                r.routing_key,
                r.props,
                r.body,
            )
        elif isinstance(r, Replicate):
            self.replicate(
                r.seq, r.op, r.queue, r.mid, r.flags, r.exchange, r.routing_key, r.props, r.body
            )
        elif isinstance(r, Replicated):
            self.replicated(r.seq)
        elif isinstance(r, Void):
            self.void(r.epoch)
        elif isinstance(r, Drained):
            self.drained(r.queue, r.epoch)
        else:
            self.session(r.epoch)


def replicate_parts(
    seq: int,
    op: int,
    queue: str,
    mid: int,
    flags: int = 0,
    exchange: str = "",
    routing_key: str = "",
    props: bytes = b"",
    body: bytes | Body = b"",
) -> tuple[bytes | Body, ...]:
    """A ``Replicate`` record's encoding, as parts (the body is not copied)."""
    head = _replicate_head(REPLICATE, seq, op, mid, flags) + _s(queue)
    if op in (R_ENQUEUE, R_SYNC):
        head += _s(exchange) + _s(routing_key) + _b(props) + _u32.pack(len(body))
        return (head, body)
    return (head,)


def joined(parts: list[bytes | Body]) -> bytes:
    """One link message of records cut from batches, in order."""
    return b"".join([MAGIC, *parts])
