"""What a server sends to one peer and waits to hear back, and the waiters that
turn queue outcomes into settlements (``transport`` uses them)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.cluster.plane import records as rec
from brokerd.cluster.plane.flow import Feeders
from brokerd.model.completion import Completion, Done
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.links import Gate

#: an unsettled forward: the message, its targets, the publishers' callbacks, and
#: whether it went flagged redelivered
Unsettled = tuple[Message, list[tuple[str, str]], list[Done] | None, bool]
#: unsettled forwards' bytes to one peer above which its feeders are paused
UNSETTLED_BYTES_HIGH = 64 * 1024 * 1024


class Outbound:
    """What this server sends to one peer, and what it waits to hear back."""

    __slots__ = (
        "acks",
        "batch",
        "feeders",
        "fwd_done",
        "fwd_message",
        "fwd_redelivered",
        "fwd_targets",
        "gate",
        "held",
        "next_seq",
        "repl",
        "settle_run",
        "spid",
        "unsettled",
        "unsettled_bytes",
        "up",
    )

    def __init__(self, spid: str) -> None:
        self.spid = spid
        self.batch = rec.Batch()
        #: the forward being gathered: one record per message, every target in it
        self.fwd_message: Message | None = None
        self.fwd_targets: list[tuple[str, str]] = []
        self.fwd_done: list[Done] = []
        self.fwd_redelivered = False
        self.next_seq = 1
        #: forwards sent and not yet settled: seq -> what to send again if the peer
        #: fails before settling (``queues.orphans``)
        self.unsettled: dict[int, Unsettled] = {}
        #: the bodies' bytes held in ``unsettled`` (flow control bounds it)
        self.unsettled_bytes = 0
        #: settlements of its forwards to send: [first, last, ok, routed]
        self.settle_run: list[Any] | None = None
        #: its link is up (deliveries wait while it is not)
        self.up = False
        #: this server's replication stream to it (as a replica of what this server
        #: owns), sent ahead of ``batch``
        self.repl = rec.Batch()
        #: acks of its stream (and resync asks), on the control lane: its confirms and
        #: deliveries wait for them, and nothing depends on their order
        self.acks = rec.Batch()
        #: ``batch`` holds a delivery that waits for the replicas: not sent until open
        self.gate: Gate | None = None
        #: earlier records cut off at each new gate: (the gate they wait for, records)
        self.held: deque[tuple[Gate | None, list[Any]]] = deque()
        #: connections (ids) and peers (spids) whose publishes were forwarded here
        #: lately, and their bytes: what flow control pauses when this link falls behind
        self.feeders = Feeders()


class Settles(Protocol):
    """Where a settlement goes (the transport: ``Transport.settle``)."""

    def settle(self, out: Outbound, seq: int, ok: bool, routed: int) -> None: ...


class SettleWaiter(Completion):
    """A forward received from a peer, settled once every queue it reached took it
    (some may defer: a relay to another server)."""

    __slots__ = ("out", "seq", "transport")

    def __init__(self, transport: Settles, out: Outbound, seq: int) -> None:
        super().__init__()
        self.transport = transport
        self.out = out
        self.seq = seq

    def complete(self) -> None:
        self.transport.settle(self.out, self.seq, self.ok, self.routed)


class Callbacks(Completion):
    """A kept forward pushed into this server's queues once it became root: the
    publishers' callbacks are called as a settlement would."""

    __slots__ = ("callbacks",)

    def __init__(self, callbacks: list[Done]) -> None:
        super().__init__()
        self.callbacks = callbacks

    def complete(self) -> None:
        for i, callback in enumerate(self.callbacks):
            callback(self.ok, self.routed if i == 0 else 0)
