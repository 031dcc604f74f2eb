"""What the model asks of a message store (seed 001: the MessageStore API).

The broker model calls these protocols, never files: ``brokerd.store``
implements them on disk (per-queue journals, an SQLite wiring store), a
standalone broker without a data directory runs with none, and the
cluster's replicated queues implement ``QueueStore`` by delegating to the
local one. The events follow seed 001: enqueued, acquired (which a plain
store may ignore), dequeued, requeued; plus paging for flow to disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.model.interfaces import PublishWaiter


class Paged(Message):
    """A queued message whose body lives only in its queue's journal (flow to disk).

    It stands in the queue's FIFO in its place, with everything routing,
    no-local and counting need; the queue loads the real message back
    (``QueueStore.load``) when it is delivered."""

    __slots__ = ("jid", "length")

    paged = True

    def __init__(self, source: Message, jid: int) -> None:
        super().__init__(
            source.exchange,
            source.routing_key,
            source.props_raw,
            b"",
            source.publisher,
            source.channel,
        )
        self.jid = jid
        self.length = len(source.body)

    @property
    def size(self) -> int:
        return self.length


class CorruptMessage(Exception):
    """``QueueStore.load`` found a paged message's record damaged: the message is
    gone (the store has logged, counted and set its bytes aside), and the queue
    skips it rather than deliver something that is not the message."""


class Gate(Protocol):
    """Output held back until the gate opens: a store that must make an acquisition
    known elsewhere (the cluster's replicas) before the delivery leaves gives its
    recipient one (``Recipient.hold``)."""

    opened: bool
    #: opened because the replicas were given up on: what was held may be lost
    failed: bool

    def on_open(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the gate opens (at once if it is open)."""


class Recipient(Protocol):
    """Where a delivery goes (a consumer, a channel answering basic.get): it can hold
    what it sends from now on until a gate opens."""

    def hold(self, gate: Gate) -> None: ...


class QueueStore(Protocol):
    """One queue's part of the store."""

    #: False while ``enqueued`` would do nothing (a transient queue's store keeps no
    #: record of a message until it pages): the queue then skips the call, per copy
    #: routed, which fanout to many queues feels
    tracks_enqueues: bool

    def enqueued(
        self, message: Message, waiter: PublishWaiter | None, *, redelivered: bool = False
    ) -> None:
        """A message entered the queue; a store that must write it first defers the
        publish (``waiter.defer()``) and answers when it is safe. ``redelivered``: it
        was delivered before (``Queue.restore``), and must come back flagged from the
        store (after a restart, at a replica promoted after a failover)."""

    def delivered(self, message: Message, consumer: Recipient | None, no_ack: bool) -> None:
        """Handed to a consumer or a get (its recipient): *acquired* (unacked), or gone
        if no-ack. A store that replicates the acquisition first holds the recipient's
        output (``consumer.hold(gate)``) until it has."""

    def dequeued(self, messages: Iterable[Message]) -> None:
        """Settled for good: acked, rejected, dropped by overflow."""

    def purged(self, messages: Iterable[Message]) -> None:
        """Every ready message dropped at once (queue.purge): one event for a store
        that keeps a log of them, a dequeue each for the others."""

    def requeued(self, messages: Iterable[Message]) -> None:
        """Back in the queue (redelivered next time)."""

    def page_out(self, message: Message) -> Paged | None:
        """Write the message's body out and return its stand-in (None: cannot now)."""

    def load(self, paged: Paged) -> Message:
        """The message a stand-in stands for, its body read back and checked; raises
        ``CorruptMessage`` (the message is gone) if its record is damaged."""

    def deleted(self) -> None:
        """The queue is gone: its records may go."""


class MessageStore(Protocol):
    """The store a broker keeps: durable wiring, and each queue's part."""

    #: bytes of bodies a queue keeps in memory before it pages new ones out
    page_limit: int

    def queue_store(self, vhost: str, queue: Any) -> QueueStore:
        """The store of a queue being declared (durable or not: any queue may page)."""

    def exchange_declared(self, vhost: str, exchange: Any) -> None: ...

    def exchange_deleted(self, vhost: str, name: str) -> None: ...

    def queue_declared(self, vhost: str, queue: Any) -> None: ...

    def queue_deleted(self, vhost: str, name: str) -> None: ...

    def bound(self, vhost: str, binding: Any) -> None: ...

    def unbound(self, vhost: str, binding: Any) -> None: ...


class WiringRecorder(Protocol):
    """Durable wiring as it changes (a store keeps it across restarts)."""

    def exchange_declared(self, vhost: str, exchange: Any) -> None: ...

    def exchange_deleted(self, vhost: str, name: str) -> None: ...

    def queue_declared(self, vhost: str, queue: Any) -> None: ...

    def queue_deleted(self, vhost: str, name: str) -> None: ...

    def bound(self, vhost: str, binding: Any) -> None: ...

    def unbound(self, vhost: str, binding: Any) -> None: ...
