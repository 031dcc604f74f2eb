"""An owner's replication stream and its replica set (seed 001; DESIGN.md section 5 "Guarantees").

Every event of a replicated or quorum queue this server owns (enqueue,
acquire, settle, requeue, purge) is numbered in one sequence for the whole
server (its stream) and sent, batched, to every other active primary
(``records.Replicate``); each replica applies the events in order and acks
the highest number it has applied (and written, for what it must write:
``records.Replicated``). With ``min_acked``, the *quorum floor*:
the highest event that the master and a majority of the known primaries hold
(the master and the ``known // 2`` replicas that acked furthest, as a
RabbitMQ quorum queue counts; one slow or paused replica stalls nothing, as
long as the others are whole: a replica counts once its snapshot is in, see
``_quorum_floor``):

- a publisher's confirm waits until ``min_acked`` passes its enqueue
  (asynchronous completion: the message is in the master queue at once, the
  confirm goes when the replicas have it: one link round trip, batched);
- a delivery waits until ``min_acked`` passes its acquisition (a ``Gate`` on
  the recipient's output), so the next owner after a failover always knows
  what the old one had delivered, and redelivers it flagged;
- settlements and requeues are not waited for (AMQP acks have no reply).

A quorum queue whose group (``x-quorum-initial-group-size``) leaves some
primaries out (``SharedQueue.group``: the members' addresses) counts its
floor over its members only: a majority of its group, the owner included
(``needed``). Its events go whole to its members; every other replica gets
the event's number alone (a settle of nothing), so each replica's stream
stays gapless and its acks mean the same, and it keeps no copy. A group of
one (the owner alone) numbers nothing: its confirms are its journal's, as a
lone primary's.

``ReplicatingStore`` (``replicated``) is the master queue's
``QueueStore``: it numbers and replicates through this stream, and delegates
writing to the local journal store, so the model and the channel never know
a queue is replicated. A replica that joins (a new or
restarted primary) gets, per queue, a reset
and a snapshot sent over several loop turns while the live stream goes on
(seed 001's live updates). A replica that lags is slow, not dead: it stays in
the set while its link is up and it is active, and its lag paces the
publishers (``plane.pacing``); one that has acked nothing for a
while raises an alarm. Only the failure evidence membership uses (the link
dropped, silence past the timeout, a refused port) takes it out. A fence in
the state log (``fence``) ends the stream for good: the replicas ack it no
more, so its owner confirms nothing more, and its queues fail over.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.cluster.plane import records as rec
from brokerd.cluster.plane.flow import Feeder, Feeders, feeder
from brokerd.cluster.queues.replication import quorum
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.cluster.queues.replication.regroup import Group, Regroups
from brokerd.cluster.queues.replication.replicas import Gate, ReplicaLink, Snapshots
from brokerd.cluster.queues.replication.store import ReplicatingStore
from brokerd.model.completion import Done
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.outbound import Outbound
    from brokerd.cluster.plane.transport import Transport
    from brokerd.cluster.queues.shared import SharedQueue
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.queues.replication.stream")


class Peers(Protocol):
    """What the replication stream asks of membership."""

    def clock(self) -> float: ...

    def known_primaries(self, now: float) -> int: ...

    def address_of(self, spid: str) -> str: ...

    def replica_peers(self) -> list[str]: ...

    def link_to(self, spid: str | None) -> Any: ...


class Stream(Snapshots, Regroups):
    """This server's replicas and its replication stream (the queues it owns)."""

    def __init__(
        self,
        transport: Transport,
        members: Peers,
        vhost: Callable[[], VirtualHost | None],
        owned_replicated: Callable[[], list[SharedQueue]],
    ) -> None:
        self.transport = transport
        self.peers = members
        self.vhost = vhost
        self.owned_replicated = owned_replicated
        self.seq = 0
        self.replicas: dict[str, ReplicaLink] = {}
        #: per group (``Group``): the confirms and the gates waiting for its floor, the
        #: newest gate not sent yet, and the floor
        self._confirms: dict[Group, deque[tuple[int, Done]]] = {}
        self._gates: dict[Group, deque[Gate]] = {}
        self._gate: dict[Group, Gate] = {}
        self._floors: dict[Group, int] = {None: 0}
        #: owned queues whose group leaves some primaries out: name -> its addresses
        self.groups: dict[str, frozenset[str]] = {}
        self._syncing = False
        self._sync_waits = False
        #: the last event before the previous snapshot step (live events since: rest)
        self._sync_seq = 0
        #: replicas that have acked nothing for longer than the patience (alarmed)
        self.stalled: set[str] = set()
        #: what enqueued into the master queues lately: local connection ids, and the
        #: spids of peers whose forwards did, and their bytes (flow control pauses
        #: them when the replicas fall behind)
        self.feeders = Feeders()
        self._last_publisher: Any = None
        self._last_feeder: Feeder = 0
        #: unconfirmed publishes not yet held by a quorum, oldest first: (enqueue seq,
        #: queue, message). If this server loses a queue before the quorum has them
        #: (fenced after a pause past the timeout), they go to its next owner
        #: (``unreplicated``) instead of dying with the reset of this copy. Bounded by
        #: the quorum lag (flow control)
        self.tail: deque[tuple[int, str, Message]] = deque()
        #: the state log fenced this server's stream (its replicas stopped acking it,
        #: its queues fail over): it confirms and delivers nothing more until the
        #: queues it owned then are placed elsewhere; then it streams again under
        #: its next ``generation`` (``restart``, from ``QueueService.
        #: placements_changed``). ``fence_seq``: that fence's state-log entry
        self.fenced = False
        self.fence_seq = -1
        #: the last fence of this server's stream it applied (the replicas accept
        #: its resets at that generation only; a byte on the wire)
        self.generation = 0
        #: the queues this server owns and streams (``adopt``/``disown``)
        self.owned: set[str] = set()
        #: queues whose group took in a member that does not hold them yet (``grow``):
        #: name -> those members' addresses, left out of the group's floor until then
        self.growing: dict[str, set[str]] = {}

    # -- the stream ------------------------------------------------------------------

    def emit(
        self, op: int, queue: str, mid: int, message: Message | None = None, flags: int = 0
    ) -> int:
        """Number one event and send it to every replica; 0 when none is needed (a
        cluster of one primary). With replicas needed and none there yet, it is
        numbered all the same, and what waits for it waits for a replica's
        snapshot. An event of a queue whose group leaves some primaries out goes
        whole to its members only (the others get its number); one of a group of
        one is not numbered."""
        group = self.groups.get(queue)
        if group is not None and len(group) <= 1:
            return 0
        if not self.replicas and self.needed(group) <= 0:
            return 0
        self.seq += 1
        seq = self.seq
        batch = self.transport.repl_batch
        if message is None:
            parts = rec.replicate_parts(seq, op, queue, mid, flags)
        else:
            parts = rec.replicate_parts(
                seq,
                op,
                queue,
                mid,
                flags,
                message.exchange,
                message.routing_key,
                message.props_raw,
                message.body,
            )
            publisher = message.publisher
            if publisher != self._last_publisher:
                self._last_publisher = publisher
                self._last_feeder = feeder(publisher)
            self.feeders.add(self._last_feeder, len(message.body))
        size = sum(map(len, parts))
        if group is None:
            for replica in self.replicas.values():
                batch(replica.out).add_parts(parts, size)
            return seq
        skip: list[bytes] | None = None
        for replica in self.replicas.values():
            if replica.address in group:
                batch(replica.out).add_parts(parts, size)
            else:
                if skip is None:
                    skip = rec.replicate_parts(seq, rec.R_SETTLE, "", 0, 0)
                batch(replica.out).add_parts(skip, sum(map(len, skip)))
        return seq

    def min_acked(self, group: Group = None) -> int:
        """The quorum floor of ``group`` (kept by ``_advance``: it is asked per publish
        and per delivery)."""
        floor = self._floors.get(group)
        if floor is None:
            floor = self._floors[group] = self._quorum_floor(group)
        return floor

    def needed(self, group: Group = None) -> int:
        """Replica acks an event needs besides the owner's own copy: a majority of
        the known primaries (of ``group``'s members, for a queue whose group leaves
        some out), the owner included, whether or not they are linked. An owner cut
        off from the others confirms nothing, as a RabbitMQ quorum queue's leader
        without a majority: the others may fence it and fail its queues over
        (``fence``), and only a majority's copies are sure to hold what it
        confirmed."""
        if group is not None:
            return quorum.needed(len(group))
        return quorum.needed(self.peers.known_primaries(self.peers.clock()))

    def group_of(self, name: str) -> Group:
        """Whose acks queue ``name``'s confirms and deliveries wait for."""
        return self.groups.get(name)

    def whole(self, replica: ReplicaLink) -> bool:
        """The replica holds every event up to its ack: its snapshot is in (it acked
        the live event that followed it)."""
        return replica.synced_at is not None and replica.acked >= replica.synced_at

    def _quorum_floor(self, group: Group = None) -> int:
        """The highest event held, with every event before it, by ``needed`` replicas
        (of ``group``'s members; a group's snapshots go to its members alone): the
        rules are ``quorum.floor``'s."""
        replicas = self.replicas.values()
        if group is not None:
            waiting = {
                a
                for name, new in self.growing.items()
                if self.groups.get(name) == group
                for a in new
            }
            replicas = [r for r in replicas if r.address in group and r.address not in waiting]  # type: ignore[assignment]
        places = (
            quorum.Place(r.acked, r.joined, r.synced_at is not None, self.whole(r))
            for r in replicas
        )
        previous = self._floors.get(group, 0)
        return quorum.floor(places, self.needed(group), self.seq, previous, self.fenced)

    def released_to(self, group: Group = None) -> int:
        """The last event whose confirms and deliveries may go: the replicas' floor.
        An owner back from a pause releases nothing its replicas did not ack; those
        that applied a fence of it ack nothing more (``Copies.fence``)."""
        return self.min_acked(group)

    def wait(self, seq: int, done: Done, group: Group = None) -> None:
        """Call ``done`` once a quorum (of ``group``) has event ``seq``."""
        if seq <= self.released_to(group):
            done(True, 1)
        else:
            confirms = self._confirms.get(group)
            if confirms is None:
                confirms = self._confirms[group] = deque()
            confirms.append((seq, done))

    def gate(self, group: Group = None) -> Gate | None:
        """A gate on the latest event (None: nothing to wait for). Until the stream is
        next sent (``sent``), the newest gate is moved on rather than a new one
        made: deliveries of one loop turn share a gate (they leave in the same
        flush anyway), so a stream costs a gate per flush, not one per delivery,
        and a gate never moves past what was sent when it was made. ``group``: the
        delivered queue's (each group's floor opens its own gates)."""
        seq = self.seq
        if seq <= self.released_to(group):
            return None
        gate = self._gate.get(group)
        if gate is None or gate.opened:
            gate = self._gate[group] = Gate(seq)
            gates = self._gates.get(group)
            if gates is None:
                gates = self._gates[group] = deque()
            gates.append(gate)
        else:
            gate.seq = seq  # the newest in its group's gates: the order holds
        return gate

    def sent(self) -> None:
        """The stream so far went out: later events get a gate of their own."""
        if self._gate:
            self._gate.clear()

    def acked(self, spid: str, seq: int) -> None:
        replica = self.replicas.get(spid)
        if replica is None:
            return
        replica.since = self.peers.clock()
        if seq == 0:  # the replica lost track (a gap, a failed write): start it again
            log.warning("replica %s asked for a resync at seq=%d", spid, self.seq)
            del self.replicas[spid]
            self.add(replica.out, self.owned_replicated())
            return
        if seq <= replica.acked:
            return
        replica.acked = min(seq, self.seq)
        if self.growing:
            self._holds_grown(replica)
        self._advance()

    def _advance(self) -> None:
        floors = self._floors
        groups: set[Group] = {None, *self.groups.values(), *self._confirms, *self._gates}
        for group in groups:
            floors[group] = self._quorum_floor(group)
        for group in [g for g in floors if g not in groups]:
            del floors[group]  # no queue of that group is owned here now
        for group, confirms in list(self._confirms.items()):
            done_to = floors[group]
            while confirms and confirms[0][0] <= done_to:
                confirms.popleft()[1](True, 1)
            if not confirms:
                del self._confirms[group]
        for group, gates in list(self._gates.items()):
            done_to = floors[group]
            while gates and gates[0].seq <= done_to:
                gates.popleft().open()
            if not gates:
                del self._gates[group]
        # the quorum's floor, not ``min_acked``: with every replica gone, the master
        # alone holds what followed
        tail, named = self.tail, self.groups
        while tail and tail[0][0] <= floors.get(named.get(tail[0][1]), 0):
            tail.popleft()

    def reset_feeders(self) -> None:
        self.feeders.clear()
        self._last_publisher = None

    def quorum_lag(self) -> int:
        """Events the replicas that confirms wait for are behind (flow control): the
        furthest behind of the groups this server's queues wait for."""
        floors = self._floors
        return self.seq - min(
            floors.get(group, self.seq) for group in (None, *self.groups.values())
        )

    def resume(self) -> None:
        """Release what waits for acks already in (the known primaries may have
        changed): called every tick."""
        self._advance()

    # -- membership ------------------------------------------------------------------

    def add(self, out: Outbound, queues: Iterable[SharedQueue]) -> None:
        """A primary joins the replica set: every queue is reset there and its snapshot
        follows over the next loop turns, interleaved with the live stream (seed 001's
        live updates), so a deep queue's snapshot never stalls the replicas that
        were there, nor the publishers they ack for. It counts for confirms and
        deliveries once its snapshot is in (``whole``; see ``_quorum_floor`` for
        right after a queue was adopted); until then its copies are not synced,
        and a failover prefers a primary whose copy is (``placing``)."""
        if out.spid in self.replicas or self.fenced:
            return
        address = self.peers.address_of(out.spid)
        replica = ReplicaLink(out, self.seq, self.peers.clock(), address)
        self.replicas[out.spid] = replica
        for group in list(self._floors):
            self._floors[group] = self._quorum_floor(group)
        batch = self.transport.repl_batch(out)
        # whatever it holds goes, the snapshot follows; live events go on after ``seq``
        batch.replicate(0, rec.R_RESET, "", self.seq, self.generation % 256)
        count = 0
        for queue in queues:
            store = queue.store
            if not isinstance(store, ReplicatingStore):
                continue
            group = self.groups.get(queue.name)
            if group is not None and address not in group:
                continue  # not of its group: the reset above dropped any copy it had
            batch.replicate(0, rec.R_RESET, queue.name, 0)
            replica.syncs.append((queue.name, deque(store.entries)))
            count += 1
        log.info("replica %s joined at seq=%d: %d queues to sync", out.spid, self.seq, count)
        self._schedule_sync()

    def remove(self, spid: str, why: str) -> None:
        if self.replicas.pop(spid, None) is not None:
            log.warning("replica %s left the set (%s) at seq=%d", spid, why, self.seq)
            self.stalled.discard(spid)
            self._advance()

    def forget(self, spid: str) -> None:
        """The server is gone for good (inactive): no alarm waits for it."""
        self.remove(spid, "gone")

    def adopt(self, name: str, entries: dict[int, Entry], group: Group = None) -> None:
        """This server owns queue ``name`` now (declared here, or failed over or moved
        to it with ``entries``): every replica resets its copy, whoever fed it, and
        those of its ``group`` (None: all) get this server's snapshot of it over the
        next loop turns. Until the snapshots are in, the replicas count by their
        live stream (see ``_quorum_floor``): what the queue held is this server's
        alone meanwhile."""
        self.owned.add(name)
        self.growing.pop(name, None)  # every member of its group gets its snapshot now
        if group is None:
            self.groups.pop(name, None)
        else:
            self.groups[name] = group
            # no event of a group new here is older than this: its floor starts at it
            self._floors.setdefault(group, self.seq)
        for replica in self.replicas.values():
            batch = self.transport.repl_batch(replica.out)
            batch.replicate(0, rec.R_RESET, name, 0)
            if group is not None and replica.address not in group:
                # not of its group: it keeps no copy (an empty snapshot prunes any it had)
                batch.replicate(0, rec.R_SYNCED, name, 0)
                continue
            if entries:
                replica.syncs.append((name, deque(entries)))
                replica.synced_at = None
                replica.queues.pop(name, None)
            else:
                batch.replicate(0, rec.R_SYNCED, name, 0)  # empty: the copy is whole
                replica.queues[name] = self.seq
        if entries and self.replicas:
            log.info("queue=%s adopted: %d messages to sync", name, len(entries))
            self._advance()
            self._schedule_sync()

    def holds(self, spid: str, name: str, seq: int) -> bool:
        """Replica ``spid`` holds queue ``name`` as this server's stream had it at event
        ``seq``: it acked that far, and its snapshot of the queue is in (all of its
        snapshots, or this queue's, followed by an event it acked). When no event
        followed that snapshot yet, one is sent for the ack to prove it: a settle of
        mid 0, which no queue has, so every replica applies it as nothing."""
        replica = self.replicas.get(spid)
        if replica is None or replica.acked < seq:
            return False
        if self.whole(replica):
            return True
        sent = replica.queues.get(name)
        if sent is None or any(queued == name for queued, _mids in replica.syncs):
            return False
        if replica.acked > sent:
            return True
        if sent == self.seq:  # nothing live followed it yet: something must
            self.emit(rec.R_SETTLE, name, 0)
        return False

    def disown(self, name: str) -> None:
        """This server no longer owns queue ``name`` (moved, failed over, deleted)."""
        self.owned.discard(name)
        self.groups.pop(name, None)
        self.growing.pop(name, None)

    def restart(self) -> None:
        """Every queue this server owned when it was fenced is placed elsewhere: its
        stream starts again, under the next generation (the replicas refuse what is
        left of the fenced one), and it may own replicated queues again."""
        self.fenced = False
        log.warning("this server's replication stream restarts: generation %d", self.generation)
        # nothing may still wait on the fenced generation's numbers: the next one's
        # replicas join with none of its queues and would ack past them
        self._fail_waiting()
        for spid in self.peers.replica_peers():
            self.add(self.transport.out(spid), self.owned_replicated())

    def fence(self, generation: int, seq: int = 0) -> None:
        """The state log fenced this server's stream: the replicas ack it no more.
        What waits for them fails (a confirm is nacked, a held delivery's connection
        closed); publishes no quorum held stay in ``tail`` for the queues' next
        owners (``unreplicated``)."""
        if generation <= self.generation:
            return  # applied already (a sync replays the log)
        log.warning("this server's replication stream is fenced at seq=%d", self.seq)
        self.generation = generation
        self.fence_seq = seq
        self.fenced = True
        self.replicas.clear()
        self.stalled.clear()
        self.reset_feeders()
        self._fail_waiting()

    def _fail_waiting(self) -> None:
        """Nack every confirm waiting on this stream and fail its held deliveries."""
        confirms, self._confirms = self._confirms, {}
        gates, self._gates = self._gates, {}
        self._gate = {}
        for waiting in confirms.values():
            for _seq, done in waiting:
                done(False, 0)
        for held in gates.values():
            for gate in held:
                gate.fail()

    def unreplicated(self, name: str, store: ReplicatingStore) -> list[tuple[Message, str]]:
        """Unconfirmed publishes to queue ``name`` no quorum holds yet that are still in
        it (``store``: ready or delivered unacked), oldest first: what an owner that
        loses the queue passes on to the next one."""
        floor = self.min_acked(self.groups.get(name))
        out = [
            (message, name)
            for seq, qname, message in self.tail
            if qname == name and seq > floor and id(message) in store.mids
        ]
        if out:
            self.tail = deque(t for t in self.tail if t[1] != name)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "min_acked": self.min_acked(),
            "waiting_confirms": sum(map(len, self._confirms.values())),
            "fenced": self.fenced,
            "replicas": {
                spid: {
                    "acked": r.acked,
                    "behind": self.seq - r.acked,
                    "syncing": len(r.syncs),
                }
                for spid, r in sorted(self.replicas.items())
            },
        }

    def members(self, group: Group = None) -> list[dict[str, Any]]:
        """Each replica (of ``group``: None for all), by spid, as the console and
        ``brokerd ctl queues`` show it: ``in_sync`` once it holds every message of
        the replicated queues (``whole``: its snapshot is proven in) and is not
        stalled, as RabbitMQ calls a mirror synchronised; ``behind``: the events it
        has not acked yet."""
        seq, stalled = self.seq, self.stalled
        return [
            {
                "spid": spid,
                "in_sync": self.whole(r) and spid not in stalled,
                "behind": seq - r.acked,
            }
            for spid, r in sorted(self.replicas.items())
            if group is None or r.address in group
        ]

    def check(self, now: float, patience: float) -> list[str]:
        """Replicas behind that have acked nothing for longer than ``patience``
        seconds (an alarm: they stay in the set, slow is not dead)."""
        self.stalled = {
            r.spid
            for r in self.replicas.values()
            if r.acked < self.seq and now - r.since > patience
        }
        return sorted(self.stalled)
