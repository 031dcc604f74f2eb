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

The stream is accepted from the current root only. A replica that finds a gap
(a link that dropped and came back while the root kept the replica), or a
stream from a root it has not been reset by, asks for a resync
(``Replicated(0)``): the root then resets it and sends a snapshot.
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

    __slots__ = ("bytes", "entries", "synced", "top")

    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        #: bodies held in memory (paged ones excluded)
        self.bytes = 0
        #: the snapshot is complete (a live replica, not one still syncing)
        self.synced = False
        #: the highest mid seen: a promoted master numbers on from here
        self.top = 0

    def ordered(self) -> list[tuple[int, Entry]]:
        return sorted(self.entries.items())


class _Write(Completion):
    """The journal write of one replicated event: the stream is acked past ``seq``
    only once it is on disk (``ReplicaSide.pending`` counts the writes of each
    event still outstanding)."""

    __slots__ = ("seq", "side")

    def __init__(self, side: ReplicaSide, seq: int) -> None:
        super().__init__()
        self.side = side
        self.seq = seq

    def defer(self) -> Done:
        if not self.deferred:
            self.side.pending[self.seq] = self.side.pending.get(self.seq, 0) + 1
        return super().defer()

    def complete(self) -> None:
        if not self.deferred:
            return  # nothing to write (a transient message): nothing was pending
        side = self.side
        left = side.pending.get(self.seq, 0) - 1
        if left > 0:
            side.pending[self.seq] = left
        else:
            side.pending.pop(self.seq, None)
        if not self.ok:
            log.error("replica write of event %d failed: resync asked", self.seq)
            side.resync()
        side.ack_soon()


class ReplicaSide:
    """This server's copies of the root's queues, and the stream feeding them."""

    def __init__(self, plane: MessagePlane) -> None:
        self.plane = plane
        self.queues: dict[str, QueueReplica] = {}
        #: the root whose stream this applies, and the last event applied from it
        self.source: str | None = None
        self.applied = 0
        #: reset by ``source`` since following it: its stream is complete here
        self.joined = False
        #: this server's copy is whole: the last snapshot it took finished and no event
        #: was missed since (the election prefers such a primary, see ``election``)
        self.complete = False
        #: events whose journal write is on its way: seq -> writes
        self.pending: dict[int, int] = {}
        self._acked = 0
        self._asked = False
        self._ack_scheduled = False
        #: servers whose stream was refused (not root yet here)
        self.refused: set[str] = set()

    def root_changed(self, root: str | None) -> None:
        """A root whose stream was refused before this server knew it is root: ask
        it to start again (its reset was among what was refused)."""
        refused, self.refused = self.refused, set()
        if root is not None and root in refused and root != self.source:
            self.switch(root)
            self.resync()

    # -- the stream --------------------------------------------------------------------

    def receive(self, out: Outbound, records: list[rec.Replicate]) -> None:
        """A batch's replication records from ``out``'s server, in order."""
        spid = out.spid
        if spid != self.plane.root_spid() or self.plane.is_root:
            log.debug("replication from %s refused: not the root", spid)
            self.refused.add(spid)  # it may be root before we know: see root_changed
            return
        if spid != self.source:
            self.switch(spid)
        for r in records:
            if r.seq == 0:
                if r.op == rec.R_RESET and not r.queue:
                    self.begin(r.mid)
                elif self.joined:
                    self.apply(r)
                continue
            if not self.joined or r.seq != self.applied + 1:
                if self.joined:
                    log.warning(
                        "replication gap from %s: event %d after %d", spid, r.seq, self.applied
                    )
                self.resync()
                return
            self.apply(r)
            self.applied = r.seq
        self.ack()

    def switch(self, root: str) -> None:
        """A new root: its stream starts from a reset; until then nothing applies."""
        self.source = root
        self.applied = 0
        self.joined = False
        self.pending.clear()
        self._acked = 0
        self._asked = False

    def begin(self, seq: int) -> None:
        """The root reset this replica: every copy goes, its snapshot follows, and the
        live stream goes on after event ``seq``."""
        for name in list(self.queues):
            if self.plane.follows_root(name):  # a classic queue's copy is its owner's own
                self.drop(name, write=True)
        self.joined = True
        self.complete = False  # until the snapshot's last record
        self._asked = False
        self.applied = seq
        self._acked = 0
        self.pending.clear()

    def resync(self) -> None:
        """Ask the root for a reset and a snapshot (once until it comes)."""
        self.joined = False
        self.complete = False
        if self._asked or self.source is None:
            return
        self._asked = True
        out = self.plane.out(self.source)
        self.plane.repl_batch(out).replicated(0)

    def ack_soon(self) -> None:
        """Writes completed: one ack at the end of the loop turn, whatever their number."""
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

    def ack(self) -> None:
        if not self.joined or self.source is None:
            return
        # ``pending`` keys are added in increasing order (events are applied in order):
        # the first is the lowest
        upto = (next(iter(self.pending)) - 1) if self.pending else self.applied
        if upto and (upto > self._acked or not self.pending):  # 0 asks for a resync
            # once per batch even if unchanged: the root hears it is alive (a sync)
            self._acked = max(upto, self._acked)
            self.plane.repl_batch(self.plane.out(self.source)).replicated(self._acked)

    # -- events ------------------------------------------------------------------------

    def apply(self, r: rec.Replicate) -> None:
        op = r.op
        if op == rec.R_ENQUEUE or op == rec.R_SYNC:
            self._add(r)
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
                self.complete = True
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

    def _add(self, r: rec.Replicate) -> None:
        replica = self.queues.get(r.queue)
        if replica is None:
            replica = self.queues[r.queue] = QueueReplica()
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
            write = _Write(self, r.seq or self.applied + 1)
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
        """This server is root now: it applies no stream (and its copy is the master)."""
        self.source = None
        self.joined = False
        self.complete = True
        self.pending.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "applied": self.applied,
            "acked": self._acked,
            "pending_writes": len(self.pending),
            "complete": self.complete,
            "queues": {
                name: {"messages": len(r.entries), "synced": r.synced}
                for name, r in sorted(self.queues.items())
            },
        }
