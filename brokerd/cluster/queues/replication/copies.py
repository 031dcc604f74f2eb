"""Replicated shared queues, a replica's side (seed 001; ``replicated`` is the owner's).

Every primary keeps a copy of every replicated or quorum queue another server
owns, fed by that owner's replication stream (``records.Replicate``): per
queue, the messages by the owner's message id (mid), each with its state
(acquired, redelivered, persistent). Persistent messages of durable queues are
written to this server's journal of the queue under the same id, and the
stream is acked (``records.Replicated``) only up to the first event whose write
is still on its way: an ack means "applied, and on disk where it must be".
Past the queue's memory limit the copy pages bodies out to the journal, as an
owner does.

The copy only serves a failover: when a placement makes this server the
queue's owner, the queue takes its copy (``take``): what was acquired at the
old owner comes back ready and flagged redelivered (its consumers' sessions
died with it), in the order the old owner numbered it.

A stream is one sending server's (``SourceStream``: what was applied from it,
its journal writes on their way, its acks), identified by the link it comes
on, so the records carry no source; every owner's is applied side by side,
and each copy records the stream that feeds it (``QueueCopy.source``). A
fenced owner's stream is refused for good and its copies stay as the fence
found them, for the root to choose the next owner from (``fence``). A replica
that finds a gap (a link that dropped and came back while the source kept the
replica), or a stream from a source it has not been reset by, asks for a
resync (``Replicated(0)``): the source then resets it and sends a snapshot.
A queue's reset keeps the copy's content, stale, until the new source's
snapshot replaces it (``reset``): an owner lost during its snapshot leaves a
whole copy behind.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.replication.content import (
    CopyContent,
    QueueCopy,
    SourceStream,
    Write,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokerd.cluster.plane.outbound import Outbound
    from brokerd.cluster.plane.transport import Transport
    from brokerd.cluster.queues.shared import SharedQueue
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.queues.replication.copies")


class Copies(CopyContent):
    """This server's copies of other servers' owned queues, and the streams feeding
    them: one per owner, applied side by side."""

    def __init__(
        self,
        transport: Transport,
        vhost: Callable[[], VirtualHost | None],
        shared_queue: Callable[[str], SharedQueue | None],
        last_root: Callable[[], str | None],
    ) -> None:
        self.transport = transport
        self.vhost = vhost
        self._shared_queue = shared_queue
        #: the root this server followed last (it stays when the root is lost: the
        #: election then compares the copies along that root's stream)
        self.last_root = last_root
        self.queues: dict[str, QueueCopy] = {}
        #: by source spid
        self.streams: dict[str, SourceStream] = {}
        #: owners the state log fenced: their streams are refused for good, and the
        #: copies they fed are frozen where the fence found them (queue -> (synced,
        #: applied)), what this server reports for their queues' failover
        self.fenced: dict[str, dict[str, tuple[bool, int]]] = {}
        #: the state-log entry of each server's last fence (a queue it owns that was
        #: placed before it fails over), and the fenced servers that still own such
        #: queues (``QueueService.placements_changed`` keeps it)
        self.fence_seq: dict[str, int] = {}
        self.pending: set[str] = set()
        self._ack_scheduled = False
        #: fences of each server applied here: its stream's generation
        self.fences: dict[str, int] = {}
        #: servers whose reset came under a generation whose fence is not applied
        #: here yet: asked again once it is
        self.after_fence: set[str] = set()
        #: sources whose reset of a queue this server still mastered was refused:
        #: asked for a resync once it masters it no more
        self.after_placement: set[str] = set()
        #: the last root's stream once let go here (gone, or fenced): where this
        #: server's copy stands on it is what the election compares until another
        #: root is followed (one stream at most, replaced by the next)
        self.retired: SourceStream | None = None

    @property
    def source(self) -> str | None:
        """The last root, whose stream the election compares (None: this server was
        root, or has followed none). Not the current root: a server that noticed the
        root's loss first once reported no copy at all until a new root came, and so
        voted for the slower peer (the election ranks a missing copy last), which
        then won the election on a copy that may have been the shorter one."""
        root = self.last_root()
        return None if root is None or root == self.transport.spid else root

    @property
    def applied(self) -> int:
        """The last event applied from the root's stream (the election compares it)."""
        stream = self._followed()
        return stream.applied if stream is not None else 0

    @property
    def complete(self) -> bool:
        """This server's copies of the root's queues are whole (see ``SourceStream``);
        a root's own are."""
        if self.source is None:
            return True
        stream = self._followed()
        return stream is not None and stream.complete

    def _followed(self) -> SourceStream | None:
        """The last root's stream, applied still or let go (``retired``)."""
        source = self.source
        if source is None:
            return None
        stream = self.streams.get(source)
        if stream is None and self.retired is not None and self.retired.source == source:
            return self.retired
        return stream

    def _let_go(self, spid: str) -> SourceStream | None:
        """Stop applying ``spid``'s stream; the last root's is kept as ``retired``."""
        stream = self.streams.pop(spid, None)
        if stream is not None and spid == self.source:
            self.retired = stream
        return stream

    def _accepts(self, spid: str) -> bool:
        """A stream this server applies: any other server's (each owner streams the
        queues it owns); a fenced one's only from its reset under the next
        generation (``begin``)."""
        return spid != self.transport.spid

    # -- the stream --------------------------------------------------------------------

    def receive(self, out: Outbound, records: list[rec.Replicate]) -> None:
        """A batch's replication records from ``out``'s server, in order."""
        spid = out.spid
        if not self._accepts(spid):
            return
        stream = self.streams.get(spid)
        if stream is None:
            stream = self.streams[spid] = SourceStream(spid)
        #: after a refused reset: its generation's records, skipped up to the next reset
        #: (a fenced owner's reset of its old generation and the one of its new may
        #: share a batch: the second must not be dropped with the first)
        refused = False
        for r in records:
            if r.seq == 0 and r.op == rec.R_RESET and not r.queue:
                refused = not self._current(stream, r.flags)
                if not refused:
                    self.begin(stream, r.mid)
                continue
            if refused:
                continue
            if r.seq == 0:
                if stream.joined:
                    self.apply(stream, r)
                continue
            if not stream.joined or r.seq != stream.applied + 1:
                if stream.joined:
                    log.warning(
                        "replication gap from %s: event %d after %d", spid, r.seq, stream.applied
                    )
                # skipped, not the batch: the reset answering the ask may follow in it
                self.resync(stream)
                continue
            self.apply(stream, r)
            stream.applied = r.seq
        self.ack(stream)

    def _current(self, stream: SourceStream, generation: int) -> bool:
        """A reset under the generation this server's count of the source's fences
        says (a byte, as the record carries it). One from before a fence is stale;
        one from after a fence this server has not applied yet waits for it
        (``fence`` asks the source again then)."""
        expected = self.fences.get(stream.source, 0) % 256
        if generation == expected:
            return True
        if (generation - expected) % 256 < 128:  # ahead: its fence is on its way here
            self.after_fence.add(stream.source)
        stream.asked = True  # not asked again until that fence, or a newer reset
        log.info(
            "reset from %s refused: generation %d, %d expected", stream.source, generation, expected
        )
        return False

    def begin(self, stream: SourceStream, seq: int) -> None:
        """The source reset this replica: every copy it fed goes (the queues it owns
        follow, each reset by name, with their snapshots), and the live stream goes
        on after event ``seq``. Except the copies of queues it owned before its last
        fence and that are not placed elsewhere here yet: the root chose their next
        owners from such copies, and the source (which applied those placements
        first) will not send them again; the next owner takes its copy, and the
        others are reset by it."""
        source = stream.source
        for name, replica in list(self.queues.items()):
            if replica.source == source and not self._failing_over(name, source):
                self.drop(name, write=True)
        stream.joined = True
        stream.complete = False  # until the snapshot's last record
        stream.asked = False
        stream.applied = seq
        stream.acked = 0
        stream.pending.clear()

    def _failing_over(self, name: str, source: str) -> bool:
        """Queue ``name`` is still ``source``'s here, placed before its last fence: its
        failover is under way, and its copy is what the root placed it by."""
        queue = self._shared_queue(name)
        return (
            queue is not None
            and queue.owner == source
            and queue.placed_seq < self.fence_seq.get(source, -1)
        )

    def resync(self, stream: SourceStream) -> None:
        """Ask the source for a reset and a snapshot (once until it comes)."""
        stream.joined = False
        stream.complete = False
        if (
            stream.asked
            or stream.source in self.after_placement
            or self.streams.get(stream.source) is not stream
        ):
            return
        stream.asked = True
        out = self.transport.out(stream.source)
        self.transport.ack_batch(out).replicated(0)

    def fences_of(self, spid: str) -> int:
        """The last fence of ``spid``'s stream applied here."""
        return self.fences.get(spid, 0)

    def fence(self, spid: str, generation: int, seq: int = 0) -> None:
        """The state log fenced owner ``spid``: its stream is applied and acked no
        more (so it can confirm and deliver nothing more), and the copies it fed
        stay as they are, for the root to choose each queue's next owner from the
        positions this server reports (``fenced_report``)."""
        if generation <= self.fences.get(spid, 0):
            return  # applied already (a sync replays the log)
        self.fences[spid] = generation
        self.fence_seq[spid] = seq
        stream = self._let_go(spid)
        applied = stream.applied if stream is not None and stream.joined else 0
        self.fenced[spid] = {
            name: (replica.synced, applied)
            for name, replica in self.queues.items()
            if replica.source == spid
        }
        log.warning("owner %s fenced: its stream stops at event %d here", spid, applied)
        if spid in self.after_fence:  # its next generation's reset came first
            self.after_fence.discard(spid)
            self.resync(self.streams.setdefault(spid, SourceStream(spid)))

    def forget(self, spid: str) -> None:
        """``spid`` is gone for good (inactive): its stream goes, unless copies it fed
        wait for a fence (they are what its queues fail over to)."""
        if not any(r.source == spid for r in self.queues.values()):
            self._let_go(spid)

    def fenced_report(self, owners: set[str] | None = None) -> dict[str, dict[str, list[Any]]]:
        """Per fenced server whose failover is under way (of ``owners``, if given):
        this server's copies of its queues, ``[synced, applied]`` each. The key
        itself says this server has applied the fence."""
        return {
            spid: {name: [synced, applied] for name, (synced, applied) in copies.items()}
            for spid, copies in self.fenced.items()
            if spid in self.pending and (owners is None or spid in owners)
        }

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
                self.transport.ack_batch(self.transport.out(one.source)).replicated(one.acked)

    # -- events ------------------------------------------------------------------------

    def apply(self, stream: SourceStream, r: rec.Replicate) -> None:
        op = r.op
        if op == rec.R_RESET:
            queue = self._shared_queue(r.queue)
            if queue is not None and queue.local:
                # the new owner's stream overtook its placement: this server still
                # masters the queue (and writes its journal); the stream is asked
                # again once the placement is applied here (``disowned``)
                self.after_placement.add(stream.source)
                self.resync(stream)
                return
            # the queue's owner is this stream's now: its snapshot replaces the copy
            self.reset(r.queue, stream.source)
            return
        replica = self.queues.get(r.queue)
        if replica is not None and replica.source != stream.source:
            if op == rec.R_ENQUEUE or op == rec.R_SYNC:
                # a copy from another stream that no reset replaced (a queue deleted
                # and declared again elsewhere): start this stream again
                log.warning(
                    "replica of %s fed by %s, not %s: resync",
                    r.queue,
                    replica.source,
                    stream.source,
                )
                self.resync(stream)
            return  # another owner's copy
        if op == rec.R_ENQUEUE or op == rec.R_SYNC:
            self._add(stream, r)
        elif op == rec.R_ACQUIRE:
            self._acquire(r.queue, r.mid, Write(self, stream, r.seq or stream.applied + 1))
        elif op == rec.R_SETTLE:
            self._settle(r.queue, r.mid)
        elif op == rec.R_REQUEUE:
            entry = self._entry(r.queue, r.mid)
            if entry is not None:
                entry.requeue()
        elif op == rec.R_PURGE:
            self._purge(r.queue)
        elif op == rec.R_SYNCED:
            if not r.queue:  # the live event after every queue's snapshot
                stream.complete = True
            if replica is not None:
                replica.synced = True
                if replica.stale:
                    self._prune(r.queue, replica)
        elif op == rec.R_DELETED:
            self.drop(r.queue, write=False)

    # -- failover ----------------------------------------------------------------------

    def disowned(self) -> None:
        """This server masters a queue no more: the streams whose reset of it was
        refused start again."""
        sources, self.after_placement = self.after_placement, set()
        for source in sources:
            stream = self.streams.get(source)
            if stream is not None:
                self.resync(stream)

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "applied": self.applied,
            "complete": self.complete,
            "streams": {
                spid: {
                    "applied": one.applied,
                    "acked": one.acked,
                    "pending_writes": len(one.pending),
                    "complete": one.complete,
                }
                for spid, one in sorted(self.streams.items())
            },
            "fenced": sorted(self.fenced),
            "queues": {
                name: {"messages": len(r.entries), "synced": r.synced, "source": r.source}
                for name, r in sorted(self.queues.items())
            },
        }
