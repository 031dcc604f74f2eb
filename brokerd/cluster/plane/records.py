"""The cluster's message plane on a link: typed records, batched (pure, no I/O).

Everything that moves messages between servers travels as records packed
into one link message (``cluster.data``) per flush: forwarded publishes and
their settlements, the operations of proxied consumers and gets, and the
owners' deliveries. Records keep their order within a link, so an ack never
overtakes the delivery it settles. docs/protocol.md documents each record.

Layout: ``RKD1`` then records; each record is one type byte and its fields.
Strings are UTF-8 with a u16 length, byte blobs (properties, bodies) a u32
length, ids u64, counts u32.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brokerd.model.message import Body

MAGIC = b"RKD1"

FORWARD = 1
SETTLE = 2
CONSUME = 3
CANCEL = 4
GET = 5
ACK = 6
REJECT = 7
CREDIT = 8
PURGE = 9
STAT = 10
REPLY = 11
DELIVER = 12
GOT = 13
SESSION = 14
REPLICATE = 15
REPLICATED = 16
VOID = 17
DRAINED = 18

#: replication operations (``Replicate.op``), a queue's owner -> its replicas
R_ENQUEUE = 1
R_ACQUIRE = 2
R_SETTLE = 3
R_REQUEUE = 4
R_PURGE = 5
#: a message of a snapshot, with its state (live updates of a joining replica)
R_SYNC = 6
#: drop the queue's replica: a snapshot follows
R_RESET = 7
#: the snapshot of the queue is complete
R_SYNCED = 8
#: the queue was deleted at the root: its replicas go (the wiring deletes its journal)
R_DELETED = 9

#: ``Replicate.flags``
F_PERSISTENT = 1
F_REDELIVERED = 2
F_ACQUIRED = 4

_replicate_head = struct.Struct("!BQBQB").pack
_u8 = struct.Struct("!B")
_u16 = struct.Struct("!H")
_u32 = struct.Struct("!I")
_u64 = struct.Struct("!Q")
_settle = struct.Struct("!BQQBI")  # type, first, last, ok, routed


class RecordError(ValueError):
    """A batch that cannot be decoded (a bug or a hostile peer): it is dropped."""


# -- the records ---------------------------------------------------------------------


@dataclass(slots=True)
class Forward:
    """A publish for queues on the receiving server (X -> Y); always settled.

    ``targets`` are ``(spid, queue)``: an empty spid means a queue of the
    receiver; another spid asks the root to relay to that server (secondaries
    are not linked to each other)."""

    seq: int
    cluster_id: str
    targets: list[tuple[str, str]]
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    #: a requeued message going back to its queue (at the head, flagged redelivered)
    redelivered: bool = False


@dataclass(slots=True)
class Settle:
    """Forwards ``first``..``last`` were taken (``ok``) by ``routed`` queues each."""

    first: int
    last: int
    ok: bool
    routed: int


@dataclass(slots=True)
class Consume:
    """Attach a proxied consumer to a shared queue at its owner."""

    req: int
    tag: str
    queue: str
    window: int
    no_ack: bool
    exclusive: bool
    no_local: bool
    origin: str


@dataclass(slots=True)
class Cancel:
    tag: str


@dataclass(slots=True)
class Get:
    req: int
    queue: str
    no_ack: bool


@dataclass(slots=True)
class Ack:
    ids: list[int]


@dataclass(slots=True)
class Reject:
    ids: list[int]
    requeue: bool


@dataclass(slots=True)
class Credit:
    """A windowed consumer handed ``count`` more deliveries to its client."""

    tag: str
    count: int


@dataclass(slots=True)
class Purge:
    req: int
    queue: str


@dataclass(slots=True)
class Stat:
    req: int
    queue: str


@dataclass(slots=True)
class Reply:
    """The answer to a request: ``code`` 0 is success, else an AMQP reply code."""

    req: int
    code: int
    text: str
    a: int = 0
    b: int = 0
    #: the error closes the connection, not only the channel
    hard: bool = False


@dataclass(slots=True)
class Deliver:
    tag: str
    delivery: int
    redelivered: bool
    exchange: str
    routing_key: str
    props: bytes
    body: bytes


@dataclass(slots=True)
class Got:
    req: int
    delivery: int
    redelivered: bool
    remaining: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes


@dataclass(slots=True)
class Session:
    """The sender starts a new session with the receiver: everything the receiver
    holds for it (consumers, unacked deliveries) is released first."""

    epoch: int


@dataclass(slots=True)
class Void:
    """The sender ended its session with the receiver on its own (a cut link, the
    receiver seen inactive): what the receiver sent it may have been dropped. It
    carries the last session epoch the sender had from the receiver (0: none, as
    from a proxy to its root); the receiver nacks its unsettled forwards, and a
    proxy whose session is with the sender opens a new one."""

    epoch: int


@dataclass(slots=True)
class Drained:
    """The sender forwards nothing more for ``queue`` to the receiver, its owner: the
    queue is being moved, and the sender keeps its publishes for it until the new
    owner is placed (``queues.handover``). Records keep their order on a link, so
    every forward the sender made for it before is in ahead of this one. ``epoch``:
    the placement that started the move (it may arrive before that placement)."""

    queue: str
    epoch: int


@dataclass(slots=True)
class Replicate:
    """One event of a shared queue's master, for its replicas (seq: the root's
    replication sequence, across every queue)."""

    seq: int
    op: int
    queue: str
    mid: int
    flags: int = 0
    exchange: str = ""
    routing_key: str = ""
    props: bytes = b""
    body: bytes = b""


@dataclass(slots=True)
class Replicated:
    """A replica applied every event up to ``seq`` (and wrote what it must)."""

    seq: int


Record = (
    Forward
    | Settle
    | Consume
    | Cancel
    | Get
    | Ack
    | Reject
    | Credit
    | Purge
    | Stat
    | Reply
    | Deliver
    | Got
    | Session
    | Void
    | Drained
    | Replicate
    | Replicated
)


# -- encoding ------------------------------------------------------------------------


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


# -- decoding ------------------------------------------------------------------------


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
