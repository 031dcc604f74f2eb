"""A replica's copies' content (``Copies``'s half, mixed in): one queue's copy
(``QueueCopy``), one source's stream as applied here (``SourceStream``), and what
each event of it does to a copy: add, acquire, settle, requeue, purge, the reset
that a new owner's snapshot replaces (``reset``, ``_prune``), and the hand-over
of a copy when this server becomes the queue's owner (``take``). A persistent
message of a durable queue goes to this server's journal of it too, and the
stream is acked past its event only once that write is on disk (``Write``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.model.completion import Completion, Done
from brokerd.model.message import Message

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokerd.model.vhost import VirtualHost
    from brokerd.store.queues import JournalQueueStore

log = logging.getLogger("brokerd.cluster.queues.replication.copies")


class Acks(Protocol):
    """What a journal write tells the copies when it is done."""

    def resync(self, stream: SourceStream) -> None: ...

    def ack_soon(self) -> None: ...


class QueueCopy:
    """One queue's copy."""

    __slots__ = ("bytes", "entries", "source", "stale", "synced", "top")

    def __init__(self, source: str | None = None) -> None:
        #: the server whose stream feeds it (None: content this server kept itself, a
        #: demoted master's or what its journal recovered, until a source resets it)
        self.source = source
        self.entries: dict[int, Entry] = {}
        #: bodies held in memory (paged ones excluded)
        self.bytes = 0
        #: the snapshot is complete (a live replica, not one still syncing)
        self.synced = False
        #: the highest mid seen: a promoted master numbers on from here
        self.top = 0
        #: mids kept from before the source's reset that its snapshot has not sent
        #: yet (``reset``): gone at the snapshot's end unless it sends them
        self.stale: set[int] = set()

    def ordered(self) -> list[tuple[int, Entry]]:
        return sorted(self.entries.items())


class SourceStream:
    """One source's replication stream as this replica applies it."""

    __slots__ = ("acked", "applied", "asked", "complete", "joined", "pending", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        #: the last event applied from it
        self.applied = 0
        #: reset by the source since following it: its stream is complete here
        self.joined = False
        #: the copies it feeds are whole: its last snapshot finished and no event was
        #: missed since (the election prefers such a primary, see ``election``)
        self.complete = False
        #: events whose journal write is on its way: seq -> writes
        self.pending: dict[int, int] = {}
        self.acked = 0
        #: a resync was asked and has not come yet
        self.asked = False


class Write(Completion):
    """The journal write of one replicated event: the stream is acked past ``seq``
    only once it is on disk (``SourceStream.pending`` counts the writes of each
    event still outstanding)."""

    __slots__ = ("seq", "side", "stream")

    def __init__(self, side: Acks, stream: SourceStream, seq: int) -> None:
        super().__init__()
        self.side = side
        self.stream = stream
        self.seq = seq

    def defer(self) -> Done:
        if not self.deferred:
            pending = self.stream.pending
            pending[self.seq] = pending.get(self.seq, 0) + 1
        return super().defer()

    def complete(self) -> None:
        if not self.deferred:
            return  # nothing to write (a transient message): nothing was pending
        stream = self.stream
        left = stream.pending.get(self.seq, 0) - 1
        if left > 0:
            stream.pending[self.seq] = left
        else:
            stream.pending.pop(self.seq, None)
        if not self.ok:
            log.error("replica write of event %d failed: resync asked", self.seq)
            self.side.resync(stream)
        self.side.ack_soon()


class CopyContent:
    """What the events of a stream do to this server's copies (``Copies``)."""

    queues: dict[str, QueueCopy]
    vhost: Callable[[], VirtualHost | None]

    if TYPE_CHECKING:

        def resync(self, stream: SourceStream) -> None: ...

        def ack_soon(self) -> None: ...

    def _store(self, name: str) -> JournalQueueStore | None:
        vhost = self.vhost()
        queue = vhost.queues.get(name) if vhost is not None else None
        return getattr(queue, "journal_store", None)

    def _entry(self, name: str, mid: int) -> Entry | None:
        replica = self.queues.get(name)
        return replica.entries.get(mid) if replica is not None else None

    def _add(self, stream: SourceStream, r: rec.Replicate) -> None:
        replica = self.queues.get(r.queue)
        if replica is None:
            replica = self.queues[r.queue] = QueueCopy(stream.source)
        if r.mid in replica.entries:
            if r.mid not in replica.stale:
                return  # a snapshot entry the live stream already brought
            # kept from before the reset: the owner's own gives the content and flags
            self._settle(r.queue, r.mid)
        message = Message(r.exchange, r.routing_key, r.props, r.body, "", 0)
        persistent = bool(r.flags & rec.F_PERSISTENT)
        acquired = bool(r.flags & rec.F_ACQUIRED)
        redelivered = bool(r.flags & rec.F_REDELIVERED)
        entry = Entry(message, acquired, redelivered, persistent)
        replica.entries[r.mid] = entry
        replica.top = max(replica.top, r.mid)
        store = self._store(r.queue)
        if store is not None:
            # a snapshot entry (seq 0) holds the ack where the live stream is
            write = Write(self, stream, r.seq or stream.applied + 1)
            # flagged on disk too: a copy restored or requeued at the master comes back
            # flagged after a restart here, not as a first delivery
            store.enqueued(message, write, jid=r.mid, redelivered=redelivered)
            if acquired:  # delivered already: its mark on disk too before the ack
                store.delivered(message, None, False, write)
            write.arm(True, 1)
            queue = self.vhost().queues[r.queue]  # type: ignore[union-attr]
            if replica.bytes > queue.page_limit:
                stub = store.page_out(message, jid=r.mid)
                if stub is not None:
                    entry.message = stub
                    return
        replica.bytes += len(r.body)

    def _acquire(self, name: str, mid: int, write: Write | None = None) -> None:
        """The owner delivered it: marked here, and on disk before the event is acked
        (the owner's delivery waits for that ack: after a crash of every server the
        copy must bring it back flagged redelivered, its owner's disk maybe lost)."""
        entry = self._entry(name, mid)
        if entry is None or entry.acquired:
            return
        entry.acquired = True
        store = self._store(name)
        if store is not None:
            store.delivered(entry.message, None, False, write)
            if write is not None:
                write.arm(True, 1)

    def _settle(self, name: str, mid: int) -> None:
        replica = self.queues.get(name)
        entry = replica.entries.pop(mid, None) if replica is not None else None
        if entry is None:
            return
        replica.stale.discard(mid)  # type: ignore[union-attr]
        message = entry.message
        if not message.paged:
            replica.bytes -= len(message.body)  # type: ignore[union-attr]
        store = self._store(name)
        if store is not None:
            store.dequeued((message,))

    def _purge(self, name: str) -> None:
        replica = self.queues.get(name)
        if replica is None:
            return
        ready = [(mid, e) for mid, e in replica.entries.items() if not e.acquired]
        for mid, entry in ready:
            del replica.entries[mid]
            replica.stale.discard(mid)
            if not entry.message.paged:
                replica.bytes -= len(entry.message.body)
        store = self._store(name)
        if store is not None and ready:
            store.purged([e.message for _, e in ready])

    def reset(self, name: str, source: str) -> None:
        """``source`` owns queue ``name`` now and sends its snapshot. The copy keeps
        what it holds meanwhile, marked stale, in its journal too: should the new
        owner fail before its snapshot is in, the copy it left is whole (what it
        held, kept here, and every event it sent since) rather than a part of a
        snapshot. Owners keep the mids they were given, so a snapshot entry finds
        its kept one; what the snapshot never sends goes at its end (``_prune``)."""
        old = self.queues.get(name)
        replica = QueueCopy(source)
        if old is None or not old.entries:
            self.drop(name, write=True)
        else:
            replica.entries, replica.bytes, replica.top = old.entries, old.bytes, old.top
            replica.stale = set(old.entries)
        self.queues[name] = replica

    def _prune(self, name: str, replica: QueueCopy) -> None:
        """The snapshot is in: what it did not send, the owner does not hold."""
        gone = [replica.entries.pop(mid) for mid in replica.stale if mid in replica.entries]
        replica.stale = set()
        for entry in gone:
            if not entry.message.paged:
                replica.bytes -= len(entry.message.body)
        store = self._store(name)
        if store is not None and gone:
            store.dequeued([e.message for e in gone])

    def drop(self, name: str, *, write: bool) -> None:
        """Forget a queue's copy; ``write``: its journal forgets it too (a reset)."""
        replica = self.queues.pop(name, None)
        if replica is None and not write:
            return
        store = self._store(name)
        if write and store is not None:
            store.reset()

    def take(self, name: str) -> QueueCopy | None:
        """The queue's copy, for this server's master queue (it becomes its owner).
        What was kept from before a reset whose snapshot never finished may have
        been delivered since: it comes back flagged redelivered."""
        replica = self.queues.pop(name, None)
        if replica is not None and replica.stale:
            for mid in replica.stale:
                entry = replica.entries.get(mid)
                if entry is not None:
                    entry.redelivered = True
            replica.stale = set()
        return replica

    def hand(self, name: str, replica: QueueCopy) -> None:
        """A demoted master's content becomes its replica (the new root resets it)."""
        self.queues[name] = replica
