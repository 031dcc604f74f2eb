"""The shared queues' service on this server: the plane's transport and every side
of the queues, built and wired once, and told of membership's events.

Seed 000's "publish message" and "intra-cluster routing", per queue owner:

- A publish routed to shared queues owned by other servers is *forwarded*
  once to each owner (``transport.forward``), with every target queue it owns
  in one record and the message's Cluster-Id (``spid/connection/channel``). A
  match to another server's private queue (a meta-binding) is pushed once to
  that server, or through the root when there is no link to it (secondaries
  are linked to primaries only). A forwarded message is applied to the
  receiver's own queues only (``intake``), so it can never loop.
- Every forward is *settled* by its receiver once its queues took it: the
  publisher's confirm waits for that, and a mandatory message nobody took
  comes back as basic.return at its origin.
- Consumers, gets and their acks on a shared queue are proxied to its owner
  (``proxy``); the owner delivers to them (``master``). A replicated or quorum
  queue's owner streams every event to the queue's replicas (``replicaset``),
  whose copies (``replica``) a next owner starts from.

A *session* with a peer lasts while both links with it are up and it is
active; when it ends, what was in flight with it is void: unsettled forwards
are nacked (never confirmed without the receiver having taken them), or, for
replicated queues, kept for their next owner (``orphans``), and the proxy
re-attaches its consumers under a new session (``records.Session``) so the
owner requeues what it had delivered to the old one. Either side may see the
session end alone (a link cut one way, a peer seen inactive from one side
only), while the other goes on counting on records that were dropped: the
side that ended it requeues at once what the peer held, ignores the peer's
consumer records until a new session, and tells it with a ``records.Void`` as
soon as a link is back, so the peer nacks its unsettled forwards and opens a
new session.

This is the composition root of the queue side: each side is built here with
the collaborators it uses (its constructor names them), never with this object;
the controller, the server and the tests reach the sides through it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.plane.flow import FlowControl
from brokerd.cluster.plane.pacing import Pacing
from brokerd.cluster.plane.transport import Transport
from brokerd.cluster.queues import kinds
from brokerd.cluster.queues.catchup import CatchUp
from brokerd.cluster.queues.handover import Handovers
from brokerd.cluster.queues.intake import Intake
from brokerd.cluster.queues.orphans import Orphans
from brokerd.cluster.queues.owner import OwnerSide
from brokerd.cluster.queues.proxy import ProxySide
from brokerd.cluster.queues.replication.copies import Copies
from brokerd.cluster.queues.replication.store import ReplicatingStore
from brokerd.cluster.queues.replication.stream import Stream
from brokerd.cluster.queues.shared import SharedQueue

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.model.broker import Broker
    from brokerd.model.message import Message
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.queues.service")


class QueueService:
    """The transport and the queue sides of this server (see the module docstring)."""

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
        self.transport = transport = Transport(members)
        #: a message for one of ``spid``'s queues (``shared.Services.forward``): the
        #: transport's own method, one call less on every publish to a remote queue
        self.forward = transport.forward
        self.reachable = transport.reachable
        clock = members.clock
        self.owner_side = OwnerSide(transport, self.vhost, vhost, members)
        self.proxy = ProxySide(transport, members, self.root_spid)
        #: this server's replication stream, to the replicas of the queues it owns
        self.stream = Stream(transport, members, self.vhost, self.owned_replicated)
        #: this server's copies of the queues other servers own
        #: the root this server followed last (kept while there is none)
        self.last_root: str | None = None
        self.copies = Copies(transport, self.vhost, self.shared_queue, lambda: self.last_root)
        #: forwards a failed owner left unsettled, for the queues' next owners
        self.orphans = Orphans(
            transport,
            self.shared_queue,
            self.is_fenced,
            clock,
            lambda: members.config.open_timeout,
        )
        self.intake = Intake(transport, self.vhost, self.orphans, self.proxy, lambda: self.is_root)
        self.orphans.apply = self.intake.apply
        #: queue moves under way (``queues.handover``)
        self.handovers = Handovers(transport, self.shared_queue, self.stream, clock)
        #: a peer's records naming a queue not here yet wait for the root (the
        #: controller gives it the wiring's barrier)
        self.catch_up = CatchUp(lambda: members.spid, self._queue_names, clock)
        #: flow control's checks
        self.pacing = Pacing(transport, self.flow, members, clock, self.stream)
        #: this server is the root (a new classic queue is the master on it until placed)
        self.is_root = False
        #: records a durable shared queue's owner (its address) in this server's
        #: store, for a whole-cluster restart (``Placer.recovered``); the server sets it
        self.on_owner: Callable[[str, str, tuple[str, ...] | None], None] | None = None
        self._wire(transport)

    def _wire(self, transport: Transport) -> None:
        """Who handles each record a peer sends, and what each flush carries."""
        catch_up = self.catch_up
        # a forward or an owner-side record may name a queue whose declare is still
        # on its way from the root: they wait for it, in the peer's order
        transport.on(rec.Forward, catch_up.wrap_forward(self.intake.on_forward))
        transport.on(rec.Void, self.intake.on_void)
        for kind in (rec.Deliver, rec.Got, rec.Reply):
            transport.on(kind, self.proxy.receive)
        transport.on(rec.Replicated, self._on_replicated)
        transport.on(rec.Drained, lambda out, r: self.handovers.drained(out.spid, r.queue, r.epoch))
        transport.default = catch_up.wrap(self.owner_side.receive)
        catch_up.after = self.owner_side.after_batch
        transport.on_stream(rec.Replicate, self.copies.receive)
        transport.after_batch.append(self.owner_side.after_batch)
        transport.before_flush.append(self.stream.sent)
        transport.before_peer.append(self.proxy.pay_credit)
        transport.after_flush.append(self.pacing.check)

    def _on_replicated(self, out: object, r: rec.Replicated) -> None:
        self.stream.acked(out.spid, r.seq)  # type: ignore[attr-defined]
        if self.handovers.out:
            self.handovers.check()

    # -- this server's shared queues ---------------------------------------------------

    def make_queue(self, name: str, vhost: str, **kwargs: Any) -> SharedQueue:
        """A shared queue of the kind its declare names (or the cluster's default)."""
        arguments = kwargs.get("arguments") or {}
        kind = kinds.kind(bool(kwargs.get("durable")), arguments, self.default_queue_type)
        return kind(name, vhost, services=self, **kwargs)

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

    def waits_on(self, spid: str) -> str | None:
        """A queue owned by ``spid`` that this server's clients wait on (publishes
        forwarded and unsettled, or kept for it; consumers proxied to it), or None:
        what a server cut off from that owner while others reach it sends its
        clients elsewhere for (``detachment.py``)."""
        out = self.transport.outbound.get(spid)
        if out is not None:
            for _message, targets, _done, _redelivered in out.unsettled.values():
                for _spid, name in targets:
                    return name
        for queue in self.shared_queues():
            if queue.owner == spid and (queue.proxied or self.orphans.holds(queue.name)):
                return queue.name
        return None

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
                copy = self.copies.queues.get(queue.name)
                report[queue.name] = copy.top if copy is not None else -1
        return report

    def owned_replicated(self) -> list[SharedQueue]:
        """The replicated and quorum queues this server owns: its stream's."""
        return [q for q in self.shared_queues() if q.local and q.replicated is not None]

    def _queue_names(self) -> Container[str]:
        vhost = self.vhost()
        return vhost.queues if vhost is not None else ()

    def shared_queue(self, name: str) -> SharedQueue | None:
        vhost = self.vhost()
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue if isinstance(queue, SharedQueue) else None

    def clock(self) -> float:
        return self.members.clock()

    # -- what the shared queues ask of the cluster (``shared.Services``) ----------------

    def forward_private(self, spid: str, queue: str, message: Message, waiter: object) -> bool:
        """A match to a private queue of ``spid``: straight there if linked, else the
        root relays it (a secondary is linked to the primaries only)."""
        if spid == self.spid:
            return False
        transport = self.transport
        if transport.out(spid).up:
            return transport.forward(spid, message, ("", queue), waiter)  # type: ignore[arg-type]
        root = self.root_spid()
        if root == self.spid:
            return False
        return transport.forward(root, message, (spid, queue), waiter)  # type: ignore[arg-type]

    # -- events from membership --------------------------------------------------------

    def receive(self, spid: str, body: bytes) -> None:
        """One link message of records from ``spid``."""
        self.transport.receive(spid, body)

    def flush(self) -> None:
        self.transport.flush()

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
        out = self.transport.out(spid)
        out.up = True
        if spid in self.members.replica_peers():
            self.stream.add(out, self.owned_replicated())
        self.owner_side.link_ready(out)
        self.proxy.session_check()
        if spid == self.root_spid():
            self._check_root_link()
        self.orphans.send()

    def peer_lost(self, spid: str, why: str) -> None:
        """A link with the peer dropped, or it went inactive: the session is over."""
        out = self.transport.outbound.get(spid)
        if out is None:
            return
        out.up = self.members.link_to(spid) is not None
        if out.unsettled or out.fwd_message is not None:
            log.warning("forwards to %s failed: %d unsettled (%s)", spid, len(out.unsettled), why)
        # keep (or nack) its forwards, drop what waited for it
        self.orphans.keep(out, maybe_taken=True)
        self.transport.reset(out)
        self.catch_up.drop(spid)
        self.stream.remove(spid, why)
        self.proxy.session_lost(spid)
        # what it held is requeued now, and what it still sends in this session ignored
        self.owner_side.void(out, gone=why == "inactive")
        if why == "inactive":
            self.stream.forget(spid)
            self.copies.forget(spid)
            self.transport.forget(spid)
        if spid == self.root_spid():
            self._check_root_link()

    def root_changed(self, old: str | None, new: str | None) -> None:
        """A new root: queues stay with their owners (the root only orders their
        placements), so only the link check and the orphans kept for want of a root
        follow it."""
        self.is_root = new == self.spid
        if new is not None:
            self.last_root = new
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
            self.stream.fence(generation, seq)
        else:
            self.copies.fence(spid, generation, seq)
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

    def regrouped(self, queue: SharedQueue) -> None:
        """A quorum queue's group changed (a grow or a shrink): its owner's confirms
        count over the new group, a new member once it holds the queue (``Stream.
        grow``); a server left out drops its copy; the group is kept with the queue's
        owner."""
        group = queue.group
        if group is None:
            return
        stream = self.stream
        if queue.local and queue.name in stream.groups:
            store = queue.store
            replicating = store if isinstance(store, ReplicatingStore) else None
            stream.regroup(queue.name, frozenset(group), replicating)
        if self.members.address not in group:
            self.copies.drop(queue.name, write=True)
        self.owner_placed(queue)

    def placements_changed(self) -> None:
        """Which fenced servers still own queues placed before their last fence
        (their failover is under way); this server, fenced, streams again once it
        owns none (``Stream.restart``). Derived from the placements' and fences'
        state-log numbers, so a server that synced a compacted log agrees."""
        fence_seq, own = self.copies.fence_seq, self.stream
        if not fence_seq and not own.fenced:
            return
        pending: set[str] = set()
        for queue in self.shared_queues():
            owner = queue.owner
            if queue.replicated_kind and owner is not None:
                fenced_at = own.fence_seq if owner == self.spid else fence_seq.get(owner, -1)
                if queue.placed_seq < fenced_at:
                    pending.add(owner)
        self.copies.pending = pending - {self.spid}
        if own.fenced and self.spid not in pending:
            own.restart()

    def is_fenced(self, spid: str) -> bool:
        """Fenced, and the queues it owned then are not all placed elsewhere yet."""
        return self.stream.fenced if spid == self.spid else spid in self.copies.pending

    def primary_seen(self, spid: str) -> None:
        """An active primary's status arrived: this server takes it as a replica of
        its stream if it is not one (it came back, or its link was restored)."""
        replicas = self.stream
        if spid not in replicas.replicas:
            out = self.transport.out(spid)
            if out.up and spid in self.members.replica_peers():
                replicas.add(out, self.owned_replicated())

    def tick(self) -> None:
        self.catch_up.tick()
        self.handovers.check()
        self.proxy.tick()
        self.owner_side.tick()
        self.orphans.send()
        self.orphans.expire()
        self.stream.resume()
        patience = 2 * self.members.config.heartbeat_timeout
        stalled = self.stream.check(self.members.clock(), patience)
        if stalled:
            self.members.raise_alarm(
                "replication",
                f"replica {', '.join(stalled)} acked nothing for {patience:.0f}s "
                "(kept in the set: its link is up)",
            )
        else:
            self.members.clear_alarm("replication")
