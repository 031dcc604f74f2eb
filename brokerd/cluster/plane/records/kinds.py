"""The records of the cluster's message plane: their type bytes, replication ops,
flags and fields (the wire layout is in ``encode`` and ``decode``; docs/protocol.md
documents each record)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

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
