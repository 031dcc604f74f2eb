"""A replicated or quorum queue's ``QueueStore`` on its owner (seed 001): it numbers
every message, sends each event through the owner's replication stream
(``replicaset.Stream``), and delegates writing to the local journal
store, so the model and the channel never know a queue is replicated."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.cluster.queues.replication.marks import ConfirmMarks
from brokerd.model.message import Message
from brokerd.model.storage import CorruptMessage, Paged
from brokerd.wire.codec import delivery_mode

if TYPE_CHECKING:
    from brokerd.cluster.queues.replication.stream import Stream
    from brokerd.model.interfaces import PublishWaiter
    from brokerd.store.queues import JournalQueueStore


class ReplicatingStore:
    """The ``QueueStore`` of a master shared queue: numbers its messages, replicates
    every event, and delegates writing to the local journal store."""

    #: every message is numbered and replicated, durable queue or not
    tracks_enqueues = True

    def __init__(
        self,
        name: str,
        stream: Stream,
        local: JournalQueueStore | None,
        entries: dict[int, Entry] | None = None,
        marks: ConfirmMarks | None = None,
    ) -> None:
        self.name = name
        #: confirm marks for the fault harness's two-owner check (None: not logged)
        self.marks = marks
        self.stream = stream
        self.local = local
        #: mid -> entry, in mid order (dicts keep insertion order; mids only grow)
        self.entries: dict[int, Entry] = entries or {}
        #: id(message) -> mid for what the queue holds or has delivered
        self.mids: dict[int, int] = {id(e.message): mid for mid, e in self.entries.items()}
        self.next_mid = max(self.entries, default=0) + 1

    def body(self, message: Message) -> bytes:
        """A message's body, read back from the journal if it is paged out."""
        if message.paged and self.local is not None:
            return self.local.read_body(message.jid)  # type: ignore[attr-defined]
        return message.body

    # -- QueueStore ------------------------------------------------------------------

    def enqueued(
        self, message: Message, waiter: PublishWaiter | None, *, redelivered: bool = False
    ) -> None:
        mid = self.next_mid
        self.next_mid = mid + 1
        persistent = delivery_mode(message.props_raw) == 2
        self.mids[id(message)] = mid
        entry = self.entries[mid] = Entry(message, redelivered=redelivered, persistent=persistent)
        if self.local is not None:
            self.local.enqueued(message, waiter, jid=mid, redelivered=redelivered)
        seq = self.stream.emit(rec.R_ENQUEUE, self.name, mid, message, entry.flags)
        if seq and waiter is not None:
            done = waiter.defer()
            if self.marks is not None:
                done = self.marks.wrap(done, seq)
            self.stream.wait(seq, done, self.stream.group_of(self.name))
        elif seq:
            self.stream.tail.append((seq, self.name, message))

    def delivered(self, message: Message, consumer: Any, no_ack: bool) -> None:
        mid = self.mids.get(id(message))
        if mid is None:
            return
        if self.local is not None:
            self.local.delivered(message, consumer, no_ack)
        if no_ack:
            del self.mids[id(message)]
            self.entries.pop(mid, None)
            seq = self.stream.emit(rec.R_SETTLE, self.name, mid)
        else:
            entry = self.entries.get(mid)
            if entry is not None:
                entry.acquired = True
            seq = self.stream.emit(rec.R_ACQUIRE, self.name, mid)
        if seq and consumer is not None:
            gate = self.stream.gate(self.stream.group_of(self.name))
            if gate is not None:
                hold = getattr(consumer, "hold", None)
                if hold is not None:
                    hold(gate)

    def dequeued(self, messages: Iterable[Message]) -> None:
        for mid in self._forget(messages):
            self.stream.emit(rec.R_SETTLE, self.name, mid)

    def purged(self, messages: Iterable[Message]) -> None:
        self._forget(messages)
        self.stream.emit(rec.R_PURGE, self.name, 0)  # one event for the whole purge

    def _forget(self, messages: Iterable[Message]) -> list[int]:
        """Messages gone from the queue: gone from the journal and from the numbering;
        their mids, for the replicas."""
        messages = list(messages)
        if self.local is not None:
            self.local.dequeued(messages)
        gone = []
        for message in messages:
            mid = self.mids.pop(id(message), None)
            if mid is not None:
                self.entries.pop(mid, None)
                gone.append(mid)
        return gone

    def requeued(self, messages: Iterable[Message]) -> None:
        for message in messages:
            mid = self.mids.get(id(message))
            entry = self.entries.get(mid) if mid is not None else None
            if entry is not None:
                entry.requeue()
                self.stream.emit(rec.R_REQUEUE, self.name, mid)  # type: ignore[arg-type]

    def page_out(self, message: Message) -> Paged | None:
        if self.local is None:
            return None
        mid = self.mids.pop(id(message), None)
        stub = self.local.page_out(message, jid=mid)
        if stub is None:
            if mid is not None:
                self.mids[id(message)] = mid
        else:
            if mid is not None:
                self.mids[id(stub)] = mid
                self.entries[mid].message = stub
        return stub

    def load(self, paged: Paged) -> Message:
        assert self.local is not None
        try:
            message = self.local.load(paged)
        except CorruptMessage:
            # gone here: the replicas settle it too, so every copy agrees
            mid = self.mids.pop(id(paged), None)
            if mid is not None:
                self.entries.pop(mid, None)
                self.stream.emit(rec.R_SETTLE, self.name, mid)
            raise
        mid = self.mids.pop(id(paged), None)
        if mid is not None:
            self.mids[id(message)] = mid
            entry = self.entries.get(mid)
            if entry is not None:
                entry.message = message
        return message

    def deleted(self) -> None:
        self.entries.clear()
        self.mids.clear()
        self.stream.disown(self.name)
        self.stream.emit(rec.R_DELETED, self.name, 0)
        if self.local is not None:
            self.local.deleted()
