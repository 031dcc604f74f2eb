"""The replicas of this server's stream: ``ReplicaLink`` (what one acked, the
snapshots still to send it), ``Gate`` (a delivery held until the replicas have its
acquisition), and the snapshots that bring a joining replica up to date while the
live stream goes on (seed 001's live updates: ``Snapshots``, mixed into
``Stream``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.replication.store import ReplicatingStore
from brokerd.model.storage import CorruptMessage

if TYPE_CHECKING:
    from brokerd.cluster.plane.outbound import Outbound
    from brokerd.cluster.plane.transport import Transport
    from brokerd.model.message import Message
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.queues.replication.stream")

#: messages of a snapshot sent per loop turn and replica, at most
SYNC_CHUNK = 500
#: seconds of a loop turn a snapshot step may take: a confirm waits at most this
#: long behind it
SYNC_TURN = 0.0002
#: while live events flow, a snapshot rests this many times as long as its last
#: step took (it then takes about a ninth of the loop, and the sending and the
#: replica's applying that follow it); on an idle owner it goes on at once
SYNC_REST = 8
#: a snapshot waits while its replica's link has this many bytes queued: the live
#: stream to that replica never queues behind more (and memory stays bounded)
SYNC_BACKLOG_MAX = 1024 * 1024
#: how soon a snapshot waiting for its link looks again (seconds)
SYNC_WAIT = 0.005


class Gate:
    """Opens once every replica has acked event ``seq`` (implements the model's Gate)."""

    __slots__ = ("_callbacks", "failed", "opened", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.opened = False
        #: opened because replication gave up (fenced): what it held is doubtful
        self.failed = False
        self._callbacks: list[Callable[[], None]] = []

    def on_open(self, callback: Callable[[], None]) -> None:
        if self.opened:
            callback()
        else:
            self._callbacks.append(callback)

    def open(self) -> None:
        if self.opened:
            return
        self.opened = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def fail(self) -> None:
        """Open without the replicas' word: holders must not trust what they held."""
        self.failed = True
        self.open()


class ReplicaLink:
    """One replica: what it acked, and the snapshots still to send it."""

    __slots__ = (
        "acked",
        "address",
        "joined",
        "out",
        "queues",
        "since",
        "spid",
        "synced_at",
        "syncs",
    )

    def __init__(self, out: Outbound, seq: int, now: float, address: str = "") -> None:
        self.out = out
        self.spid = out.spid
        #: its known-hosts address: what a quorum queue's group names
        self.address = address
        #: the last event it acked; it joins at ``seq`` and counts as having what came
        #: before (that is the snapshot's, and waits for the replicas that were there)
        self.acked = seq
        #: the event it joined at: what came before reaches it only with its snapshot
        self.joined = seq
        #: the live event that follows its snapshot (None: still syncing)
        self.synced_at: int | None = None
        #: when it last acked anything (or joined): one silent too long raises an alarm
        self.since = now
        #: (queue name, mids still to send)
        self.syncs: deque[tuple[str, deque[int]]] = deque()
        #: queue name -> the stream's last event when that queue's snapshot was sent
        #: whole: an ack of any later event proves the replica holds the queue
        self.queues: dict[str, int] = {}


class Snapshots:
    """Sending the replicas their snapshots, a chunk per loop turn (``Stream``)."""

    seq: int
    replicas: dict[str, ReplicaLink]
    transport: Transport
    peers: Any
    vhost: Callable[[], VirtualHost | None]
    _syncing: bool
    _sync_waits: bool
    _sync_seq: int
    #: queues whose group took in members that do not hold them yet (``Regroups``)
    growing: dict[str, set[str]]

    if TYPE_CHECKING:

        def emit(
            self, op: int, queue: str, mid: int, message: Message | None = None, flags: int = 0
        ) -> int: ...

    def _schedule_sync(self) -> None:
        if not self._syncing:
            self._syncing = True
            try:
                asyncio.get_running_loop().call_soon(self._sync_step)
            except RuntimeError:  # no loop (unit tests): run it all now
                self._syncing = False
                while self.sync_step():
                    pass

    def _sync_step(self) -> None:
        """One step of the snapshots, then the next: at once on an idle owner, after a
        rest while the live stream flows (seed 001's live updates: the sync yields
        to the traffic), later while every snapshot waits for its link."""
        self._syncing = False
        began, seq = time.perf_counter(), self.seq
        if not self.sync_step():
            return
        self._syncing = True
        loop = asyncio.get_running_loop()
        if self._sync_waits:
            loop.call_later(SYNC_WAIT, self._sync_step)
        elif self._sync_seq != seq:
            loop.call_later((time.perf_counter() - began) * SYNC_REST, self._sync_step)
        else:
            loop.call_soon(self._sync_step)
        self._sync_seq = seq

    def sync_step(self) -> bool:
        """Send the next chunk of every replica's snapshots; True if more is left."""
        vhost = self.vhost()
        more = False
        sent = False
        done: list[ReplicaLink] = []
        grown: list[str] = []
        turn_ends = time.perf_counter() + SYNC_TURN
        for replica in self.replicas.values():
            link = self.peers.link_to(replica.spid)
            if replica.syncs and link is not None and link.backlog > SYNC_BACKLOG_MAX:
                more = True  # its link is behind: the snapshot waits, the live stream not
                continue
            sent = sent or bool(replica.syncs)
            budget = SYNC_CHUNK
            batch = self.transport.repl_batch(replica.out)
            while replica.syncs and budget:
                name, mids = replica.syncs[0]
                queue = vhost.queues.get(name) if vhost is not None else None
                store = getattr(queue, "store", None)
                if not isinstance(store, ReplicatingStore):
                    replica.syncs.popleft()
                    continue
                while mids and budget:
                    mid = mids.popleft()
                    entry = store.entries.get(mid)
                    if entry is None:
                        continue  # settled since the snapshot began: nothing to send
                    try:
                        message, body = entry.message, store.body(entry.message)
                    except CorruptMessage:
                        continue  # corrupt here (logged, quarantined): the queue drops it

                    batch.replicate(
                        0,
                        rec.R_SYNC,
                        name,
                        mid,
                        entry.flags,
                        message.exchange,
                        message.routing_key,
                        message.props_raw,
                        body,
                    )
                    budget -= 1
                    if not budget % 32 and time.perf_counter() > turn_ends:
                        budget = 0  # this turn's share is spent
                if not mids:
                    batch.replicate(0, rec.R_SYNCED, name, 0)
                    replica.syncs.popleft()
                    replica.queues[name] = self.seq
                    if replica.address in self.growing.get(name, ()):
                        grown.append(name)
            if not replica.syncs and replica.synced_at is None:
                done.append(replica)
            more = more or bool(replica.syncs)
        for replica in done:
            # a live event after the snapshot: its ack proves the snapshot is in
            replica.synced_at = self.emit(rec.R_SYNCED, "", 0)
            log.info("replica %s: snapshot sent, synced at seq=%d", replica.spid, replica.synced_at)
        for name in grown:
            # a grown member counts once it acks an event after its snapshot of the
            # queue (``_holds_grown``): with the publishers all waiting for that, none
            # would come, so one is sent (a settle of mid 0: nothing to every replica)
            self.emit(rec.R_SETTLE, name, 0)
        self._sync_waits = more and not sent
        return more
