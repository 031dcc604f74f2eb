"""Replicated shared queues, a replica's side (seed 001; ``replicated`` is the root's).

Every primary that is not root keeps a copy of every master queue, fed by the
root's replication stream (``records.Replicate``): per queue, the messages by
the root's message id (mid), each with its state (acquired, redelivered,
persistent). Persistent messages of durable queues are written to this
server's journal of the queue under the same id, and the stream is acked
(``records.Replicated``) only up to the first event whose write is still on its
way: an ack means "applied, and on disk where it must be". Past the queue's
memory limit the copy pages bodies out to the journal, as a master does.

The copy only serves a failover: when this server becomes root, each shared
queue takes its copy (``take``): what was acquired at the old root comes back
ready and flagged redelivered (its consumers' sessions died with that root),
in the order the root numbered it.

A stream is one sending server's (``SourceStream``: what was applied from it,
its journal writes on their way, its acks), identified by the link it comes
on, so the records carry no source. Today the stream is accepted from the
current root only, the one server that masters replicated queues; per-queue
owners (issue 23) will each send one, and a replica will apply every owner's
side by side. A replica that finds a gap (a link that dropped and came back
while the source kept the replica), or a stream from a source it has not
been reset by, asks for a resync (``Replicated(0)``): the source then resets
it and sends a snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.entry import Entry
from brokerd.model.completion import Completion, Done
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.forwarding import MessagePlane, Outbound
    from brokerd.store.queues import JournalQueueStore

log = logging.getLogger("brokerd.cluster.queues.replica")


class QueueReplica:
    """One queue's copy."""

    __slots__ = ("bytes", "entries", "source", "synced", "top")

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


class _Write(Completion):
    """The journal write of one replicated event: the stream is acked past ``seq``
    only once it is on disk (``SourceStream.pending`` counts the writes of each
    event still outstanding)."""

    __slots__ = ("seq", "side", "stream")

    def __init__(self, side: ReplicaSide, stream: SourceStream, seq: int) -> None:
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


class ReplicaSide:
    """This server's copies of other servers' master queues, and the streams feeding
    them."""

    def __init__(self, plane: MessagePlane) -> None:
        self.plane = plane
        self.queues: dict[str, QueueReplica] = {}
        #: by source spid
        self.streams: dict[str, SourceStream] = {}
        #: the root whose stream this server follows (None: none yet, or this is root)
        self.source: str | None = None
        #: this server is (or was last) root and holds no stream of another root yet:
        #: its content is the master's, whole
        self._own = False
        self._ack_scheduled = False
        #: servers whose stream was refused (not root yet here)
        self.refused: set[str] = set()

    @property
    def applied(self) -> int:
        """The last event applied from the root's stream (the election compares it)."""
        stream = self.streams.get(self.source) if self.source is not None else None
        return stream.applied if stream is not None else 0

    @property
    def complete(self) -> bool:
        """This server's copy of the root's queues is whole (see ``SourceStream``)."""
        if self._own:
            return True
        stream = self.streams.get(self.source) if self.source is not None else None
        return stream is not None and stream.complete

    def _accepts(self, spid: str) -> bool:
        """A stream this server applies: the root's (it masters every replicated
        queue), unless this server is root."""
        return spid == self.plane.root_spid() and not self.plane.is_root

    def root_changed(self, root: str | None) -> None:
        """A root whose stream was refused before this server knew it is root: ask
        it to start again (its reset was among what was refused)."""
        refused, self.refused = self.refused, set()
        if root is not None and root in refused and root != self.source:
            self.resync(self.switch(root))

    # -- the stream --------------------------------------------------------------------

    def receive(self, out: Outbound, records: list[rec.Replicate]) -> None:
        """A batch's replication records from ``out``'s server, in order."""
        spid = out.spid
        if not self._accepts(spid):
            log.debug("replication from %s refused: not the root", spid)
            self.refused.add(spid)  # it may be root before we know: see root_changed
            return
        stream = self.streams.get(spid) if spid == self.source else None
        if stream is None:
            stream = self.switch(spid)
        for r in records:
            if r.seq == 0:
                if r.op == rec.R_RESET and not r.queue:
                    self.begin(stream, r.mid)
                elif stream.joined:
                    self.apply(stream, r)
                continue
            if not stream.joined or r.seq != stream.applied + 1:
                if stream.joined:
                    log.warning(
                        "replication gap from %s: event %d after %d", spid, r.seq, stream.applied
                    )
                self.resync(stream)
                return
            self.apply(stream, r)
            stream.applied = r.seq
        self.ack(stream)

    def switch(self, root: str) -> SourceStream:
        """A new root: its stream starts from a reset; until then nothing applies.
        The old root's stream is over (its queues are the new root's now)."""
        if self.source is not None:
            self.streams.pop(self.source, None)
        self.source = root
        self._own = False
        stream = self.streams[root] = SourceStream(root)
        return stream

    def begin(self, stream: SourceStream, seq: int) -> None:
        """The source reset this replica: every copy it feeds goes, its snapshot
        follows, and the live stream goes on after event ``seq``. The root's reset
        covers every queue that follows the root, whoever fed its copy before."""
        for name in list(self.queues):
            if self.plane.follows_root(name):  # a classic queue's copy is its owner's own
                self.drop(name, write=True)
        stream.joined = True
        stream.complete = False  # until the snapshot's last record
        stream.asked = False
        stream.applied = seq
        stream.acked = 0
        stream.pending.clear()

    def resync(self, stream: SourceStream) -> None:
        """Ask the source for a reset and a snapshot (once until it comes)."""
        stream.joined = False
        stream.complete = False
        if stream.asked or self.streams.get(stream.source) is not stream:
            return
        stream.asked = True
        out = self.plane.out(stream.source)
        self.plane.repl_batch(out).replicated(0)

    def ack_soon(self) -> None:
        """Writes completed: one ack per stream at the end of the loop turn, whatever
        their number."""
        if self._ack_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (unit tests): now
            self.ack()
            return
        self._ack_scheduled = True
        loop.call_soon(self._ack_now)

    def _ack_now(self) -> None:
        self._ack_scheduled = False
        self.ack()

    def ack(self, stream: SourceStream | None = None) -> None:
        """Tell a source (every one, by default) how far its stream is applied and
        written here."""
        for one in (stream,) if stream is not None else tuple(self.streams.values()):
            if not one.joined:
                continue
            # ``pending`` keys are added in increasing order (events are applied in
            # order): the first is the lowest
            upto = (next(iter(one.pending)) - 1) if one.pending else one.applied
            if upto and (upto > one.acked or not one.pending):  # 0 asks for a resync
                # once per batch even if unchanged: the source hears it is alive (a sync)
                one.acked = max(upto, one.acked)
                self.plane.repl_batch(self.plane.out(one.source)).replicated(one.acked)

    # -- events ------------------------------------------------------------------------

    def apply(self, stream: SourceStream, r: rec.Replicate) -> None:
        op = r.op
        if op == rec.R_ENQUEUE or op == rec.R_SYNC:
            self._add(stream, r)
        elif op == rec.R_ACQUIRE:
            self._acquire(r.queue, r.mid)
        elif op == rec.R_SETTLE:
            self._settle(r.queue, r.mid)
        elif op == rec.R_REQUEUE:
            entry = self._entry(r.queue, r.mid)
            if entry is not None:
                entry.requeue()
        elif op == rec.R_PURGE:
            self._purge(r.queue)
        elif op == rec.R_RESET:
            self.drop(r.queue, write=True)
        elif op == rec.R_SYNCED:
            if not r.queue:  # the live event after every queue's snapshot
                stream.complete = True
            replica = self.queues.get(r.queue)
            if replica is not None:
                replica.synced = True
        elif op == rec.R_DELETED:
            self.drop(r.queue, write=False)

    def _store(self, name: str) -> JournalQueueStore | None:
        vhost = self.plane.vhost()
        queue = vhost.queues.get(name) if vhost is not None else None
        return getattr(queue, "journal_store", None)

    def _entry(self, name: str, mid: int) -> Entry | None:
        replica = self.queues.get(name)
        return replica.entries.get(mid) if replica is not None else None

    def _add(self, stream: SourceStream, r: rec.Replicate) -> None:
        replica = self.queues.get(r.queue)
        if replica is None:
            replica = self.queues[r.queue] = QueueReplica(stream.source)
        if r.mid in replica.entries:
            return  # a snapshot entry the live stream already brought
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
            write = _Write(self, stream, r.seq or stream.applied + 1)
            # flagged on disk too: a copy restored or requeued at the master comes back
            # flagged after a restart here, not as a first delivery
            store.enqueued(message, write, jid=r.mid, redelivered=redelivered)
            write.arm(True, 1)
            if acquired:
                store.delivered(message, None, False)
            queue = self.plane.vhost().queues[r.queue]  # type: ignore[union-attr]
            if replica.bytes > queue.page_limit:
                stub = store.page_out(message, jid=r.mid)
                if stub is not None:
                    entry.message = stub
                    return
        replica.bytes += len(r.body)

    def _acquire(self, name: str, mid: int) -> None:
        entry = self._entry(name, mid)
        if entry is None or entry.acquired:
            return
        entry.acquired = True
        store = self._store(name)
        if store is not None:
            store.delivered(entry.message, None, False)

    def _settle(self, name: str, mid: int) -> None:
        replica = self.queues.get(name)
        entry = replica.entries.pop(mid, None) if replica is not None else None
        if entry is None:
            return
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
            if not entry.message.paged:
                replica.bytes -= len(entry.message.body)
        store = self._store(name)
        if store is not None and ready:
            store.purged([e.message for _, e in ready])

    def drop(self, name: str, *, write: bool) -> None:
        """Forget a queue's copy; ``write``: its journal forgets it too (a reset)."""
        replica = self.queues.pop(name, None)
        if replica is None and not write:
            return
        store = self._store(name)
        if write and store is not None:
            store.reset()

    # -- failover ----------------------------------------------------------------------

    def take(self, name: str) -> QueueReplica | None:
        """The queue's copy, for this server's master queue (it becomes root)."""
        return self.queues.pop(name, None)

    def hand(self, name: str, replica: QueueReplica) -> None:
        """A demoted master's content becomes its replica (the new root resets it)."""
        self.queues[name] = replica

    def forget_source(self) -> None:
        """This server is root now: it applies no root's stream (its copy is the
        master)."""
        if self.source is not None:
            self.streams.pop(self.source, None)
        self.source = None
        self._own = True

    def describe(self) -> dict[str, Any]:
        stream = self.streams.get(self.source) if self.source is not None else None
        return {
            "source": self.source,
            "applied": self.applied,
            "acked": stream.acked if stream is not None else 0,
            "pending_writes": len(stream.pending) if stream is not None else 0,
            "complete": self.complete,
            "queues": {
                name: {"messages": len(r.entries), "synced": r.synced}
                for name, r in sorted(self.queues.items())
            },
        }
