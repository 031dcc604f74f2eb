"""The message plane: moving messages between the servers of a cluster.

Seed 000's "publish message" and "Intra-cluster routing", on the links:

- A publish routed to shared queues owned by other servers is *forwarded*
  once to each owner, with every target queue it owns in one record and the
  message's Cluster-Id (``spid/connection/channel``). A match to another
  server's private queue (a meta-binding) is pushed once to that server, or
  through the root when there is no link to it (secondaries are linked to
  primaries only). A forwarded message is applied to the receiver's own
  queues only, so it can never loop.
- Every forward is *settled* by its receiver once its queues took it (runs
  of settlements travel as ranges): the publisher's confirm waits for that,
  and a mandatory message nobody took comes back as basic.return at its
  origin.
- Consumers, gets and their acks on a shared queue are proxied to its owner
  (``proxy``); the owner delivers to them (``master``).

Records to one peer gather in one ``Batch`` and leave once per event-loop
turn (sooner past ``FLUSH_BYTES``), in order, on the peer's link. The
replication stream (``replicated``, ``replica``) has a batch of its own per
peer that leaves first, and the acks of the peer's stream one that takes the
link's control lane; the other batch is held while a delivery in it waits
for the replicas (``Outbound.gate``).

A *session* with a peer lasts while both links with it are up and it is
active; when it ends, what was in flight with it is void: unsettled forwards
are nacked (never confirmed without the receiver having taken them), or, for
replicated queues, kept for their next owner (``orphans``), and
the proxy re-attaches its consumers under a new session (``records.Session``)
so the owner requeues what it had delivered to the old one. Either side may
see the session end alone (a link cut one way, a peer seen inactive from one
side only), while the other goes on counting on records that were dropped:
the side that ended it requeues at once what the peer held, ignores the
peer's consumer records until a new session, and tells it with a
``records.Void`` as soon as a link is back, so the peer nacks its unsettled
forwards and opens a new session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.plane.flow import FlowControl, feeder
from brokerd.cluster.plane.orphans import Orphans
from brokerd.cluster.plane.outbound import Outbound, SettleWaiter
from brokerd.cluster.plane.pacing import Pacing
from brokerd.cluster.queues.handover import Handovers
from brokerd.cluster.queues.master import MasterSide
from brokerd.cluster.queues.proxy import ProxySide
from brokerd.cluster.queues.replica import ReplicaSide
from brokerd.cluster.queues.replicaset import Gate, ReplicaSet
from brokerd.cluster.queues.shared import SharedQueue
from brokerd.model.interfaces import PublishWaiter
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.link import Link
    from brokerd.cluster.membership import Membership
    from brokerd.model.broker import Broker
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.plane.forwarding")

DATA = "cluster.data"
#: a batch this large leaves at once instead of at the end of the loop turn
FLUSH_BYTES = 256 * 1024


class MessagePlane:
    """Forwards, settlements and the link batches; the root and proxy sides use it."""

    def __init__(
        self,
        members: Membership,
        broker: Broker | None,
        vhost: str,
        on_block: Callable[[str, str | None], None] | None = None,
    ) -> None:
        self.members = members
        self.broker = broker
        self.vhost_name = vhost
        #: sets or clears a cause of blocking publishers (the server's block_publishers)
        self.on_block = on_block
        #: which connections are paused, and why (the controller connects it to the server)
        self.flow = FlowControl()
        self.outbound: dict[str, Outbound] = {}
        self.master = MasterSide(self)
        self.proxy = ProxySide(self)
        #: as root: the replicas of the master queues; else: this server's copies
        self.replicas = ReplicaSet(self)
        self.replica = ReplicaSide(self)
        #: this server is the root: its shared queues are the masters
        self.is_root = False
        self._flush_scheduled = False
        #: flow control's checks (``pacing``)
        self.pacing = Pacing(self)
        #: forwards a failed root left unsettled, for the next root (``orphans``)
        self.orphans = Orphans(self)
        #: queue moves under way (``queues.handover``)
        self.handovers = Handovers(self)
        #: the root before the last change (its forwards are kept after it)
        self._last_id: tuple[Any, str] = (None, "")
        #: records a durable shared queue's owner (its address) in this server's
        #: store, for a whole-cluster restart (``Placer.recovered``); the server sets it
        self.on_owner: Callable[[str, str, tuple[str, ...] | None], None] | None = None

    @property
    def spid(self) -> str:
        return self.members.spid

    def root_spid(self) -> str | None:
        return self.members.current_root

    def vhost(self) -> VirtualHost | None:
        return self.broker.vhosts.get(self.vhost_name) if self.broker is not None else None

    def shared_queues(self) -> list[SharedQueue]:
        vhost = self.vhost()
        if vhost is None:
            return []
        return [q for q in vhost.queues.values() if isinstance(q, SharedQueue)]

    @property
    def default_queue_type(self) -> str | None:
        """The cluster file's type for shared queues declared without one."""
        return self.members.config.default_queue_type

    def placed_queues(self) -> list[SharedQueue]:
        """The shared queues the state log has placed (each on its owner)."""
        return [q for q in self.shared_queues() if q.epoch]

    def recovered_report(self) -> dict[str, int]:
        """Per replicated queue that waits for its last owner after a whole-cluster
        restart (no owner, a home): the highest message id of this server's
        recovered copy (0: an empty one; -1: none, as on a server whose disk was
        replaced), for the root to choose the queue's owner from (``Placer``)."""
        report: dict[str, int] = {}
        for queue in self.placed_queues():
            if queue.owner is None and queue.home and queue.replicated_kind:
                copy = self.replica.queues.get(queue.name)
                report[queue.name] = copy.top if copy is not None else -1
        return report

    def owned_replicated(self) -> list[SharedQueue]:
        """The replicated and quorum queues this server owns: its stream's."""
        return [q for q in self.shared_queues() if q.local and q.replicated is not None]

    def reachable(self, spid: str) -> bool:
        """Its link is up and membership has not found it inactive: a paused server
        keeps its link, and what is sent to it waits there until it resumes."""
        out = self.outbound.get(spid)
        return out is not None and out.up and self.members.is_active(spid)

    def shared_queue(self, name: str) -> SharedQueue | None:
        vhost = self.vhost()
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue if isinstance(queue, SharedQueue) else None

    def cluster_id(self, message: Message) -> str:
        """``spid/connection/channel`` of the message's publisher (the last one made is
        kept: a publisher sends many messages in a row)."""
        key = (message.publisher, message.channel)
        if key != self._last_id[0]:
            if isinstance(message.publisher, int):
                text = f"{self.spid}/{message.publisher}/{message.channel}"
            else:
                text = f"{message.publisher}/{message.channel}"
            self._last_id = (key, text)
        return self._last_id[1]

    # -- outbound ------------------------------------------------------------------

    def out(self, spid: str) -> Outbound:
        out = self.outbound.get(spid)
        if out is None:
            out = self.outbound[spid] = Outbound(spid)
            out.up = self.members.link_to(spid) is not None
        return out

    def batch(self, out: Outbound) -> rec.Batch:
        """The peer's batch, for a record that must follow everything sent before it."""
        if out.fwd_message is not None:
            self.finish_forward(out)
        if out.batch.size > FLUSH_BYTES:
            self._post(out)
        self.schedule()
        return out.batch

    def repl_batch(self, out: Outbound) -> rec.Batch:
        """The peer's replication batch (always sent, ahead of the other one)."""
        if out.repl.size > FLUSH_BYTES:
            self._post_repl(out)
        self.schedule()
        return out.repl

    def ack_batch(self, out: Outbound) -> rec.Batch:
        """The acks of the peer's stream (the control lane)."""
        self.schedule()
        return out.acks

    def hold(self, out: Outbound, gate: Gate) -> None:
        """A delivery to ``out``'s server waits for ``gate`` (its acquisition must reach
        the replicas first), and so does everything after it. What was gathered
        before waits only for the gate before: segments leave in order as their
        gates open, so a steady stream flows one replica round trip behind."""
        if gate.opened or out.gate is gate:
            return
        if out.batch:
            out.held.append((out.gate, out.batch.cut()))
        out.gate = gate
        gate.on_open(self.schedule)

    def schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: unit tests flush by hand
                self._flush_scheduled = False

    def forward(
        self,
        spid: str | None,
        message: Message,
        target: tuple[str, str],
        waiter: PublishWaiter | None,
        redelivered: bool = False,
    ) -> bool:
        """Send ``message`` for ``target`` (spid, queue) to server ``spid``; one record
        per message and server, so pushes of one publish to several of its queues
        share it. False if the server cannot be reached (the publisher is nacked)."""
        if spid is None or spid == self.spid:
            return False
        out = self.out(spid)
        if not out.up:
            return False
        if out.fwd_message is not message or out.fwd_redelivered != redelivered:
            if out.fwd_message is not None:
                self.finish_forward(out)
            out.fwd_message = message
            out.fwd_redelivered = redelivered
            self.schedule()
        out.fwd_targets.append(target)
        out.feeders.add(feeder(message.publisher), len(message.body))
        if waiter is not None:
            out.fwd_done.append(waiter.defer())
        return True

    def forward_private(
        self, spid: str, queue: str, message: Message, waiter: PublishWaiter | None
    ) -> bool:
        """A match to a private queue of ``spid``: straight there if linked, else the
        root relays it (a secondary is linked to the primaries only)."""
        if spid == self.spid:
            return False
        if self.out(spid).up:
            return self.forward(spid, message, ("", queue), waiter)
        root = self.root_spid()
        if root == self.spid:
            return False
        return self.forward(root, message, (spid, queue), waiter)

    def finish_forward(self, out: Outbound) -> None:
        message = out.fwd_message
        assert message is not None
        seq = out.next_seq
        out.next_seq = seq + 1
        out.batch.forward(
            seq,
            self.cluster_id(message),
            out.fwd_targets,
            message.exchange,
            message.routing_key,
            message.props_raw,
            message.body,
            out.fwd_redelivered,
        )
        out.unsettled[seq] = (message, out.fwd_targets, out.fwd_done or None, out.fwd_redelivered)
        out.unsettled_bytes += len(message.body)
        out.fwd_message = None
        out.fwd_targets = []
        out.fwd_done = []
        out.fwd_redelivered = False
        if out.batch.size > FLUSH_BYTES:
            self._post(out)  # a link message stays small: the receiver's turn stays short

    def settle(self, out: Outbound, seq: int, ok: bool, routed: int) -> None:
        """A forward from ``out``'s server is settled: coalesce runs into ranges."""
        run = out.settle_run
        if run is not None and seq == run[1] + 1 and run[2] == ok and run[3] == routed:
            run[1] = seq
            return
        if run is not None:
            self.batch(out).settle(*run)
        out.settle_run = [seq, seq, ok, routed]
        self.schedule()

    def flush(self) -> None:
        """Send every peer's batch (once per loop turn)."""
        self._flush_scheduled = False
        self.replicas.sent()
        for out in list(self.outbound.values()):
            self._send(out, credit=True)
        self.pacing.check()

    def flush_peer(self, spid: str) -> None:
        """Send what is gathered for ``spid`` now (a control message follows it)."""
        out = self.outbound.get(spid)
        if out is not None:
            self._send(out, credit=False)

    def _send(self, out: Outbound, *, credit: bool) -> None:
        """Everything gathered for ``out``'s server, in order: the stream's acks, the
        stream, the forward being gathered, settlements, proxied consumers' credit
        (``credit``), then the batch as far as its gates allow."""
        if out.acks:
            self._post_acks(out)
        if out.repl:
            self._post_repl(out)
        if out.fwd_message is not None:
            self.finish_forward(out)
        if out.settle_run is not None:
            out.batch.settle(*out.settle_run)
            out.settle_run = None
        if credit:
            self.proxy.pay_credit(out)
        if out.batch or out.held:
            self._post(out)

    def _post_repl(self, out: Outbound) -> None:
        data = out.repl.take()
        link = self.members.link_to(out.spid)
        # the stream keeps its place after what was posted before it
        if link is None or not link.post(DATA, data):
            log.debug("replication to %s dropped: link down (%d bytes)", out.spid, len(data))

    def _post_acks(self, out: Outbound) -> None:
        data = out.acks.take()
        link = self.members.link_to(out.spid)
        # acks jump the queue: the owner's confirms and deliveries wait for them
        if link is None or not link.post(DATA, data, True):
            log.debug("replication acks to %s dropped: link down", out.spid)

    def _post(self, out: Outbound) -> None:
        """Send what no closed gate holds, as link messages of about ``FLUSH_BYTES``
        each (cut between the segments a gate or a full batch left): the peer
        applies a link message in one loop turn, so a batch that grew behind a
        slow gate must not reach it as one message of many megabytes."""
        held = out.held
        if out.gate is not None and not out.gate.opened and out.batch.size > FLUSH_BYTES:
            # gated and full: what follows waits for the same gate, in a new segment
            out.held.append((out.gate, out.batch.cut()))
        segments: list[list[Any]] = []
        while held and (held[0][0] is None or held[0][0].opened):
            segments.append(held.popleft()[1])
        if not held and (out.gate is None or out.gate.opened):
            out.gate = None
            if out.batch:
                segments.append(out.batch.cut())
        if not segments:
            return  # deliveries in it wait for the replicas
        link = self.members.link_to(out.spid)
        parts: list[Any] = []
        size = 0
        for segment in segments:
            parts += segment
            size += sum(map(len, segment))
            if size > FLUSH_BYTES:
                self._post_parts(out, link, parts)
                parts, size = [], 0
        if parts:
            self._post_parts(out, link, parts)

    def _post_parts(self, out: Outbound, link: Link | None, parts: list[Any]) -> None:
        data = rec.joined(parts)
        if link is None or not link.post(DATA, data):
            log.debug("batch to %s dropped: link down (%d bytes)", out.spid, len(data))

    # -- inbound -------------------------------------------------------------------

    def receive(self, spid: str, body: bytes) -> None:
        """One link message of records from ``spid``, applied in order."""
        try:
            records = rec.decode(body)
        except rec.RecordError as exc:
            log.warning("record batch refused from=%s: %s", spid, exc)
            return
        out = self.out(spid)
        master, proxy = self.master, self.proxy
        stream: list[rec.Replicate] = []
        for r in records:
            if isinstance(r, rec.Forward):
                self._on_forward(out, r)
            elif isinstance(r, rec.Settle):
                self._on_settle(out, r)
            elif isinstance(r, rec.Deliver | rec.Got | rec.Reply):
                proxy.receive(out, r)
            elif isinstance(r, rec.Void):
                self._on_void(out, r)
            elif isinstance(r, rec.Replicate):
                stream.append(r)
            elif isinstance(r, rec.Replicated):
                self.replicas.acked(spid, r.seq)
                if self.handovers.out:
                    self.handovers.check()
            elif isinstance(r, rec.Drained):
                self.handovers.drained(spid, r.queue, r.epoch)
            else:
                master.receive(out, r)
        if stream:
            self.replica.receive(out, stream)
        master.after_batch(out)

    def _on_forward(self, out: Outbound, r: rec.Forward) -> None:
        origin, _, channel = r.cluster_id.rpartition("/")
        message = Message(
            r.exchange,
            r.routing_key,
            r.props,
            r.body,
            origin,
            int(channel) if channel.isascii() and channel.isdigit() else 0,
        )
        waiter = SettleWaiter(self, out, r.seq)
        ok, routed = self.apply_forward(message, r.targets, r.redelivered, waiter)
        waiter.arm(ok, routed)

    def apply_forward(
        self,
        message: Message,
        targets: list[tuple[str, str]],
        redelivered: bool,
        waiter: PublishWaiter,
        kept: bool = False,
    ) -> tuple[bool, int]:
        """Push a forwarded message into this server's queues: (all took it, routed).
        ``kept``: it is one of the kept publishes (``orphans``), going in at last."""
        vhost = self.vhost()
        ok = True
        routed = 0
        for spid, name in targets:
            if spid and spid != self.spid:
                # a relay: the root passes a secondary's match on to another secondary
                if self.is_root and self.forward(spid, message, ("", name), waiter):
                    routed += 1
                else:
                    ok = False
                continue
            queue = vhost.queues.get(name) if vhost is not None else None
            if queue is None:
                continue  # gone meanwhile: not routed (a mandatory return at the origin)
            if getattr(queue, "replicated_kind", False) and (
                queue.frozen
                or (not queue.local and queue.moving == self.spid)
                or (queue.local and not kept and self.orphans.holds(name))
            ):
                # kept for the queue's next owner, in order: this server handed it over
                # already (``handover``), or is the target of its move and has not the
                # placement yet (the sender had it first), or keeps publishes for it
                # that this one must not overtake
                self.orphans.hold(message, ("", name), waiter, redelivered)
                routed += 1
                continue
            if not queue.local:
                ok = False  # not owned here (a failover moved it): the publisher is nacked
                continue
            if redelivered:
                queue.restore(message, waiter)
                routed += 1
            elif queue.push(message, waiter):
                routed += 1
            else:
                ok = False
        return ok, routed

    def _on_settle(self, out: Outbound, r: rec.Settle) -> None:
        unsettled = out.unsettled
        if r.last - r.first >= len(unsettled):  # a wide range: walk what is waiting instead
            seqs = [s for s in unsettled if r.first <= s <= r.last]
        else:
            seqs = range(r.first, r.last + 1)
        for seq in seqs:
            entry = unsettled.pop(seq, None)
            if entry is None:
                continue
            out.unsettled_bytes -= len(entry[0].body)
            done = entry[2]
            if done:
                for i, callback in enumerate(done):
                    callback(r.ok, r.routed if i == 0 else 0)

    def _on_void(self, out: Outbound, r: rec.Void) -> None:
        """The peer ended our session on its own: what we sent it may have been dropped.
        Forwards it did take were settled before this record (one ordered link)."""
        count = len(out.unsettled)
        # it may have taken some: their settlements may have been dropped with the
        # link that ended the session (the void itself comes on the next one)
        self.orphans.keep(out, maybe_taken=True)
        # a void of a session that never was (epoch 0) with nothing to resend is routine:
        # the peer ended the data lane's session on a cut link, whatever it carried
        log.log(
            logging.WARNING if count or r.epoch else logging.INFO,
            "session voided by %s (epoch %d): %d unsettled forwards to send again",
            out.spid,
            r.epoch,
            count,
        )
        self.proxy.voided(out.spid)
        self.orphans.send()

    # -- events from membership --------------------------------------------------------

    def fail_forwards(self, out: Outbound) -> None:
        """The link with the peer is gone: keep (or nack) its forwards, drop what
        waited for it."""
        self.orphans.keep(out, maybe_taken=True)
        out.batch = rec.Batch()
        out.repl = rec.Batch()
        out.acks = rec.Batch()
        out.gate = None
        out.held.clear()
        out.settle_run = None

    def _check_root_link(self) -> None:
        """Block publishers while the link to the root is down: what they publish for
        shared queues could only be nacked (a new root, or the link, ends it)."""
        if self.on_block is None:
            return
        root = self.root_spid()
        if root is None or root == self.spid or self.members.link_to(root) is not None:
            self.on_block("cluster-root-link", None)
        else:
            self.on_block(
                "cluster-root-link", f"cluster not ready: the link to root {root} is down"
            )

    def link_ready(self, spid: str) -> None:
        out = self.out(spid)
        out.up = True
        if spid in self.members.replica_peers():
            self.replicas.add(out, self.owned_replicated())
        self.master.link_ready(out)
        self.proxy.session_check()
        if spid == self.root_spid():
            self._check_root_link()
        self.orphans.send()

    def peer_lost(self, spid: str, why: str) -> None:
        """A link with the peer dropped, or it went inactive: the session is over."""
        out = self.outbound.get(spid)
        if out is None:
            return
        out.up = self.members.link_to(spid) is not None
        if out.unsettled or out.fwd_message is not None:
            log.warning("forwards to %s failed: %d unsettled (%s)", spid, len(out.unsettled), why)
        self.fail_forwards(out)
        self.replicas.remove(spid, why)
        self.proxy.session_lost(spid)
        # what it held is requeued now, and what it still sends in this session ignored
        self.master.void(out, gone=why == "inactive")
        if why == "inactive":
            self.replicas.forget(spid)
            self.replica.forget(spid)
            self.outbound.pop(spid, None)
        if spid == self.root_spid():
            self._check_root_link()

    def root_changed(self, old: str | None, new: str | None) -> None:
        """A new root: queues stay with their owners (the root only orders their
        placements), so only the link check and the orphans kept for want of a root
        follow it."""
        self.is_root = new == self.spid
        if new is not None and not self.is_root:
            self.proxy.session_check()
        self.orphans.send()
        self._check_root_link()

    def fence(self, spid: str, generation: int, seq: int = 0) -> None:
        """The state log fenced ``spid``'s replication stream, its ``generation``-th
        fence (its owned queues fail over): this server stops applying and acking
        it, or, if it is this server's own, stops confirming through it until those
        queues are placed elsewhere. A fence applied already (a sync replays the
        log) changes nothing."""
        if spid == self.spid:
            self.replicas.fence(generation, seq)
        else:
            self.replica.fence(spid, generation, seq)
        self.placements_changed()

    def owner_placed(self, queue: SharedQueue) -> None:
        """A durable shared queue's owner changed: remembered by address (stable across
        restarts, where spids are not) if this server knows it."""
        owner, hook = queue.owner, self.on_owner
        if hook is None or owner is None or not queue.durable:
            return
        if owner == self.spid:
            address = self.members.address
        else:
            peer = self.members.peers.get(owner)
            address = peer.address if peer is not None else ""
        if address:
            hook(queue.name, address, queue.group)

    def placements_changed(self) -> None:
        """Which fenced servers still own queues placed before their last fence
        (their failover is under way); this server, fenced, streams again once it
        owns none (``ReplicaSet.restart``). Derived from the placements' and fences'
        state-log numbers, so a server that synced a compacted log agrees."""
        fence_seq, own = self.replica.fence_seq, self.replicas
        if not fence_seq and not own.fenced:
            return
        pending: set[str] = set()
        for queue in self.shared_queues():
            owner = queue.owner
            if queue.replicated_kind and owner is not None:
                fenced_at = own.fence_seq if owner == self.spid else fence_seq.get(owner, -1)
                if queue.placed_seq < fenced_at:
                    pending.add(owner)
        self.replica.pending = pending - {self.spid}
        if own.fenced and self.spid not in pending:
            own.restart()

    def is_fenced(self, spid: str) -> bool:
        """Fenced, and the queues it owned then are not all placed elsewhere yet."""
        return self.replicas.fenced if spid == self.spid else spid in self.replica.pending

    def primary_seen(self, spid: str) -> None:
        """An active primary's status arrived: this server takes it as a replica of
        its stream if it is not one (it came back, or its link was restored)."""
        replicas = self.replicas
        if spid not in replicas.replicas:
            out = self.out(spid)
            if out.up and spid in self.members.replica_peers():
                replicas.add(out, self.owned_replicated())

    def tick(self) -> None:
        self.handovers.check()
        self.proxy.tick()
        self.master.tick()
        self.orphans.send()
        self.orphans.expire()
        self.replicas.resume()
        patience = 2 * self.members.config.heartbeat_timeout
        stalled = self.replicas.check(self.members.clock(), patience)
        if stalled:
            self.members.raise_alarm(
                "replication",
                f"replica {', '.join(stalled)} acked nothing for {patience:.0f}s "
                "(kept in the set: its link is up)",
            )
        else:
            self.members.clear_alarm("replication")
