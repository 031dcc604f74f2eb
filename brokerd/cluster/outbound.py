"""What a server sends to one peer and waits to hear back, and the waiters that
turn queue outcomes into settlements (``forwarding`` uses them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.cluster import records as rec
from brokerd.cluster.flow import Feeders
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.forwarding import MessagePlane
    from brokerd.cluster.replicated import Gate

Done = Callable[[bool, int], None]
#: an unsettled forward: the message, its targets, the publishers' callbacks, and
#: whether it went flagged redelivered
Unsettled = tuple[Message, list[tuple[str, str]], list[Done] | None, bool]
#: unsettled forwards' bytes to one peer above which its feeders are paused
UNSETTLED_BYTES_HIGH = 64 * 1024 * 1024


class Outbound:
    """What this server sends to one peer, and what it waits to hear back."""

    __slots__ = (
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
        #: fails before settling (see ``MessagePlane.orphan``)
        self.unsettled: dict[int, Unsettled] = {}
        #: the bodies' bytes held in ``unsettled`` (flow control bounds it)
        self.unsettled_bytes = 0
        #: settlements of its forwards to send: [first, last, ok, routed]
        self.settle_run: list[Any] | None = None
        #: its link is up (deliveries wait while it is not)
        self.up = False
        #: replication records for it (root -> replica, or acks back), sent first
        self.repl = rec.Batch()
        #: ``batch`` holds a delivery that waits for the replicas: not sent until open
        self.gate: Gate | None = None
        #: earlier records cut off at each new gate: (the gate they wait for, records)
        self.held: deque[tuple[Gate | None, list[Any]]] = deque()
        #: connections (ids) and peers (spids) whose publishes were forwarded here
        #: lately, and their bytes: what flow control pauses when this link falls behind
        self.feeders = Feeders()


class SettleWaiter:
    """A forward received from a peer, settled once every queue it reached took it
    (some may defer: a relay to another server). Implements ``PublishWaiter``."""

    __slots__ = ("armed", "deferred", "ok", "out", "plane", "routed", "seq", "waiting")

    def __init__(self, plane: MessagePlane, out: Outbound, seq: int) -> None:
        self.plane = plane
        self.out = out
        self.seq = seq
        self.deferred = 0
        self.waiting = 0
        self.ok = True
        self.routed = 0
        self.armed = False

    def defer(self) -> Done:
        self.deferred += 1
        self.waiting += 1
        return self._done

    def _done(self, ok: bool, routed: int) -> None:
        self.waiting -= 1
        self.ok = self.ok and ok
        self.routed += routed
        if self.waiting == 0 and self.armed:
            self.plane.settle(self.out, self.seq, self.ok, self.routed)

    def arm(self, ok: bool, routed: int) -> None:
        self.ok = self.ok and ok
        self.routed += routed - self.deferred
        self.armed = True
        if self.waiting == 0:
            self.plane.settle(self.out, self.seq, self.ok, self.routed)


class Callbacks:
    """A kept forward pushed into this server's queues once it became root: the
    publishers' callbacks are called as a settlement would (implements
    ``PublishWaiter``)."""

    __slots__ = ("armed", "done", "ok", "routed", "waiting")

    def __init__(self, done: list[Done]) -> None:
        self.done = done
        self.waiting = 0
        self.ok = True
        self.routed = 0
        self.armed = False

    def defer(self) -> Done:
        self.waiting += 1
        return self._one

    def _one(self, ok: bool, routed: int) -> None:
        self.waiting -= 1
        self.ok = self.ok and ok
        if self.waiting == 0 and self.armed:
            self._finish()

    def arm(self, ok: bool, routed: int) -> None:
        self.ok = self.ok and ok
        self.routed = routed
        self.armed = True
        if self.waiting == 0:
            self._finish()

    def _finish(self) -> None:
        for i, callback in enumerate(self.done):
            callback(self.ok, self.routed if i == 0 else 0)
