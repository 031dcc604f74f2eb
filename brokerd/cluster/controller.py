"""The cluster controller: membership, wiring and messages, behind the connection hooks.

``ClusterController`` is the server's one cluster object. It *is* the
membership (``membership.Membership``: links, peers, heartbeats, admission),
which has the election loop (``standing``, a ``standing.Standing``), and it
owns the objects built on it:

- ``wiring`` (``wiring.replication.WiringReplication``): the ordered cluster state;
- ``queues`` (``queues.service.QueueService``): the shared queues' service on
  this server, the message plane's transport (``plane.transport``) and every side
  of the queues: forwarded publishes, proxied consumers and gets, owners'
  deliveries, replication, moves;
- ``operations`` (``operations.OperatorCommands``): root enable/disable,
  reconfiguration, fault injection and the status; the controller's methods
  of the same names delegate to it.

It implements the events membership and its standing announce
(``standing.StandingEvents``: root taken or changed, a peer lost, a sync
wanted, the lease renewed) by handing them to the queue service.

It installs the cluster's queue types into the clustered vhost (shared
queues are ``queues.shared.SharedQueue``; other servers' private queues are reached
through ``queues.shared.MetaQueue``) and routes what arrives on the cluster
exchange to the part it belongs to. The broker model and the channel know
none of this: they see queues.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.election import PRIMARY
from brokerd.cluster.members import MemberChanges
from brokerd.cluster.membership import Membership
from brokerd.cluster.messages import CLUSTER_EXCHANGE
from brokerd.cluster.operations import OperatorCommands, servers
from brokerd.cluster.ownership.bridges import BridgePlacements
from brokerd.cluster.ownership.groups import GroupChanges
from brokerd.cluster.ownership.moves import QueueMoves
from brokerd.cluster.ownership.placer import Placer
from brokerd.cluster.plane.pacing import OVERRUN
from brokerd.cluster.plane.transport import DATA
from brokerd.cluster.queues.service import QueueService
from brokerd.cluster.queues.shared import RemoteQueues, SharedQueue
from brokerd.cluster.stopping import PlannedStop
from brokerd.cluster.wiring import replication as wiring
from brokerd.model.broker import Broker
from brokerd.model.errors import AMQPError, access_refused
from brokerd.model.message import Message
from brokerd.model.muxers import Binding, Muxer
from brokerd.model.queue import Queue

if TYPE_CHECKING:
    from pamqp.base import Frame as Method

    from brokerd.protocol.connection import Connection
    from brokerd.protocol.hooks import WiringDone

log = logging.getLogger("brokerd.cluster")


#: event-loop lag (seconds) above which the cluster's feeders are paused, and below
#: which they resume
LOOP_LAG_HIGH = 0.25
LOOP_LAG_LOW = 0.05
#: flow control held this long (seconds, sampled each heartbeat) raises the alarm
FLOW_ALARM_AFTER = 5.0


class ClusterExchange(Muxer):
    """The cluster exchange as clients see it. Links' records never reach it: the
    channel hands them to ``ClusterController.link_records`` before routing. It
    exists so that the name stays the cluster's (a reserved ``amq.`` exchange, not
    counted against limits), and refuses whatever else is published to it."""

    type_name = "x-rookery-cluster"
    client_traffic = False

    def bind(self, binding: Binding) -> None:
        raise access_refused("the cluster exchange cannot be bound")

    def validate(self, routing_key: str, arguments: dict[str, Any]) -> None:
        raise access_refused("the cluster exchange cannot be bound")

    def unbind(self, binding: Binding) -> None:
        return None

    def route(self, message: Message) -> tuple[()]:
        raise access_refused("only cluster links may publish to the cluster exchange")


class ClusterController(PlannedStop, Membership):
    def __init__(
        self,
        config: ClusterConfig,
        *,
        broker: Broker | None = None,
        on_block: Callable[[str, str | None], None] | None = None,
        on_flow: Callable[[int, bool], None] | None = None,
        members_dir: Path | None = None,
        join: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, broker=broker, **kwargs)
        self.operations = OperatorCommands(self)
        self.queues = QueueService(self, broker, config.vhost, on_block)
        #: flow control: the server pauses and resumes reading connections with ``on_flow``
        self.flow = self.queues.flow
        self.flow.pause = on_flow
        self.flow.data_lane = self._pausable_lane
        self._flow_since: float | None = None
        self.remote = RemoteQueues(self.queues)
        self.wiring = wiring.WiringReplication(self, broker, self.remote)
        #: the root's placement of classic shared queues
        self.placer = Placer(self, self.queues, self.wiring)
        self.wiring.placer = self.placer.place
        #: a peer's records naming a queue not here wait for the root's barrier
        self.queues.catch_up.barrier = self.wiring.barrier
        self.wiring.seed_placer = self.placer.recovered
        #: operators' queue moves and rebalances (``moving``)
        self.moves = QueueMoves(self.placer)
        self.queues.handovers.on_handed = self.moves.handed
        self.wiring.on_fence = self._fence
        #: where the configuration document's bridges run
        self.bridges = BridgePlacements(self, self.wiring, self.placer)
        self.wiring.on_bridge_place = self.bridges.applied
        self.wiring.is_fenced = self.queues.is_fenced
        self.wiring.fences = self.queues.copies.fences_of
        #: the members as replicated state: joins, forgets, discovery (``members``)
        self.member_changes = MemberChanges(
            self, members_dir, join=join, discovery=config.discovery
        )
        self.wiring.member_change = self.member_changes.change
        self.wiring.on_members = self.member_changes.applied
        #: quorum groups that follow the members (``ctl queues shrink``, forgets)
        self.group_changes = GroupChanges(self)
        self.placer.group_changes = self.group_changes
        vhost = broker.vhosts.get(config.vhost) if broker is not None else None
        if vhost is not None:
            vhost.queue_factory = self.make_queue
            vhost.on_queue_deleted.append(self.wiring.private_queue_removed)
            vhost.on_queue_deleted.append(self.queues.proxy.queue_gone)

    def _pausable_lane(self, spid: str) -> int | None:
        """The inbound data lane flow control may pause to slow a peer down: a
        secondary's. A primary's carries its replication stream, which this server
        must keep applying (its acks are what let that primary confirm; owners
        pausing each other would stall them all); a primary's forwards are paced at
        its end instead, by their settlements (which wait for the replicas) and its
        link's backlog."""
        peer = self.peers.get(spid)
        if peer is not None and peer.status is not None and peer.status.type == PRIMARY:
            return None
        return self.data_lane(spid)

    def _fence(self, spid: str, generation: int, seq: int) -> None:
        """A fence applied: the root waits for this server's copies of the fenced
        owner's queues (``placing``), so a follower reports them at once rather
        than at its next heartbeat."""
        self.queues.fence(spid, generation, seq)
        if not self.decision.is_root:
            link = self.link_to(self.current_root)
            if link is not None:
                self.heartbeat.send_status(link)

    def make_queue(self, name: str, vhost: str, **kwargs: Any) -> Queue:
        """The clustered vhost's queue types: exclusive ones are private (local),
        the others shared (master on their owner, proxy elsewhere)."""
        if kwargs.get("exclusive_owner") is not None:
            return Queue(name, vhost, **kwargs)
        queue = self.queues.make_queue(name, vhost, **kwargs)
        queue.on_unused = self._shared_unused
        return queue

    def _shared_unused(self, queue: Queue) -> None:
        """An auto-delete shared queue lost its last consumer, anywhere, or an
        x-expires one went unused (its timer runs on the master): the root removes
        it for the whole cluster, ordered like any deletion (a classic queue's owner
        that is not root asks it to)."""
        if self.root_now():
            self.wiring.order_delete(queue)
        elif isinstance(queue, SharedQueue) and queue.local:
            # gone here at once, as on a single broker (a declare that follows sees a
            # 404); the other servers drop it when the root orders the delete
            self.wiring.request_delete(queue)
            vhost = self.queues.vhost()
            if vhost is not None:
                vhost.remove_queue(queue)

    def root_now(self) -> bool:
        """Re-run the election before acting as root: after a freeze (SIGSTOP) the
        stored decision is stale, and the stall check must demote us first."""
        return self.evaluate().is_root

    # -- operator commands (``operations``) ---------------------------------------------

    def set_root_enabled(self, enabled: bool) -> dict[str, Any]:
        return self.operations.set_root_enabled(enabled)

    def reconfigure(self, config: ClusterConfig) -> dict[str, Any]:
        return self.operations.reconfigure(config)

    def cut_link(self, spid: str) -> dict[str, Any]:
        return self.operations.cut_link(spid)

    def heal(self) -> dict[str, Any]:
        return self.operations.heal()

    def summary(self) -> dict[str, Any]:
        return self.operations.summary()

    # -- connection hooks ---------------------------------------------------------------

    #: where links publish their records (``link_records`` takes them first)
    link_exchange = CLUSTER_EXCHANGE

    def link_records(self, conn: Connection, kind: str, body: bytes) -> None:
        """A link's records, straight from the channel: to membership or the planes."""
        try:
            self.receive(conn.id, kind, body)
        except AMQPError:
            raise  # a link that is not allowed here, refused with its reply code
        except Exception:  # a bug handling one message must not cost the link
            log.exception("cluster message from connection %s failed", conn.id)

    def delegate(self, conn: Connection, method: Method, done: WiringDone) -> bool:
        return self.wiring.delegate(conn, method, done)

    def replicate(self, conn: Connection, method: Method) -> None:
        self.wiring.replicate(conn, method)

    def catch_up(self, conn: Connection, resume: Callable[[], None]) -> bool:
        return self.wiring.catch_up(conn, resume)

    def known_hosts(self) -> str:
        """The servers a client may reconnect to: the known hosts and every active
        peer's address (connection.open-ok's known-hosts, at most 255 bytes); a worker
        of ``brokerd --workers`` names hosts, never its siblings' or any worker's links."""
        if self.client_address is not None and self.hostgroup is None:
            return self.client_address
        now = self.clock()
        hosts = dict.fromkeys(sorted(self.known))
        for peer in self.peers.values():
            if not self.standing.active(peer, now) or peer.status is None:
                continue
            if self.hostgroup is not None:  # a host's client address, never a worker's link
                if peer.status.host_address:
                    hosts[peer.status.host_address] = None
            elif peer.address:
                hosts[peer.address] = None
        text = ""
        for host in hosts:
            candidate = f"{text},{host}" if text else host
            if len(candidate.encode()) > 255:
                break
            text = candidate
        return text

    # -- the planes' messages and events ------------------------------------------------------

    def receive_plane(self, spid: str, kind: str, body: bytes) -> None:
        if kind == DATA:
            self.queues.receive(spid, body)
        elif kind in wiring.KINDS:
            self.wiring.receive(spid, kind, body)
        else:
            super().receive_plane(spid, kind, body)

    def became_root(self) -> None:
        self.wiring.became_root()

    def synced(self, root: str) -> None:
        self.queues.proxy.session_check()

    def in_sync(self, root: str) -> bool:
        return self.wiring.in_sync(root, self.term_of(root))

    def waits_on(self, spid: str) -> str | None:
        return self.queues.waits_on(spid)

    def term_of(self, spid: str) -> int:
        """The term a server acts in, as its latest status says (ours: our own)."""
        if spid == self.spid:
            return self.standing.term.number
        peer = self.peers.get(spid)
        return peer.status.term if peer is not None and peer.status is not None else 0

    def want_sync(self, root: str) -> None:
        self.wiring.want_sync(root, self.term_of(root))

    def root_changed(self, old: str | None, new: str | None) -> None:
        if new != self.spid:
            self.wiring.acks.release()  # what waited was ordered: answer it
        self.queues.root_changed(old, new)
        self.placer.root_changed(new == self.spid)
        self.placer.check()  # owners known lost already fail over at once

    def peer_lost(self, spid: str, why: str) -> None:
        self.wiring.acks.lost(spid)
        self.queues.peer_lost(spid, why)
        if why == "inactive" and self.decision.is_root:
            self.wiring.server_gone(spid)
            self.placer.check(lost=spid)
            self.bridges.check()

    def loop_lag(self, lag: float) -> None:
        """The event loop woke ``lag`` seconds late: past ``LOOP_LAG_HIGH`` what feeds
        the cluster most (everything, past ``OVERRUN`` times that) is paused until it
        is on time again (flow control)."""
        flow = self.flow
        if lag > LOOP_LAG_HIGH:
            flow.hold(
                "event-loop",
                f"the event loop runs {lag * 1000:.0f} ms late",
                self.queues.pacing.loop_feeders(overrun=lag > OVERRUN * LOOP_LAG_HIGH),
            )
        elif lag < LOOP_LAG_LOW and "event-loop" in flow.causes:
            flow.release("event-loop")

    def closed(self, conn: Connection) -> None:
        self.flow.forget(conn.id)
        super().closed(conn)

    def forgotten(self, address: str, node: str, member: bool) -> str | None:
        return self.member_changes.forgotten(address, node, member)

    def status_received(self, spid: str, status: Any) -> None:
        self.member_changes.from_status(self.peers[spid], status.members)
        self.wiring.root_status(spid, status.state_seq)
        if status.type == PRIMARY:
            self.queues.primary_seen(spid)
            if status.fenced and self.decision.is_root and self.root_now():
                self.placer.check()  # copies reported under a fence: fail over now

    def is_active(self, spid: str) -> bool:
        """Heard within the timeout: membership has not found it inactive."""
        peer = self.peers.get(spid)
        return peer is not None and self.standing.active(peer, self.clock())

    def address_of(self, spid: str) -> str:
        """A peer's known-hosts address ("" while unknown): what a quorum queue's group
        names (spids change at every start)."""
        if spid == self.spid:
            return self.address
        peer = self.peers.get(spid)
        return peer.address if peer is not None else ""

    def replica_peers(self) -> list[str]:
        """The servers that keep copies of the master queues: the active primaries
        this server has a link to."""
        now = self.clock()
        return [
            peer.spid
            for peer in self.peers.values()
            if peer.status is not None
            and peer.status.type == PRIMARY
            and self.standing.active(peer, now)
            and self.link_to(peer.spid) is not None
        ]

    def state_seq(self) -> int:
        return self.wiring.last_seq

    def state_source(self) -> str | None:
        return self.wiring.synced_root

    def state_term(self) -> int:
        # a root's log is its own, under the term it acts in (renewed terms included)
        if self.standing.role_root:
            return self.standing.term.number
        return self.wiring.synced_term

    def lease_renewed(self) -> None:
        self.queues.stream.resume()

    def copy_complete(self) -> bool:
        return self.queues.copies.complete  # a root's own copies are whole

    def record_needed(self, spid: str) -> bool:
        """An earlier run's record stays while a queue names it as owner, its failover
        is under way here (fenced, its queues not all placed elsewhere), or a bridge
        is placed on it."""
        if spid in self.queues.copies.pending:
            return True
        if any(placed == spid for placed, _epoch in self.bridges.placed.values()):
            return True
        return any(q.owner == spid for q in self.queues.shared_queues())

    def copy_position(self) -> tuple[str, int] | None:
        if self.queues.is_root:
            return (self.spid, self.queues.stream.seq)
        replica = self.queues.copies
        return None if replica.source is None else (replica.source, replica.applied)

    def fenced_copies(self) -> dict[str, dict[str, list[Any]]]:
        return self.queues.copies.fenced_report()

    def recovered_copies(self) -> dict[str, int]:
        return self.queues.recovered_report()

    def before_send(self, spid: str) -> None:
        self.queues.transport.flush_peer(spid)

    def link_ready(self, spid: str) -> None:
        self.queues.link_ready(spid)

    def tick(self) -> None:
        self.member_changes.tick()
        self.wiring.tick()
        self.queues.tick()
        # the election runs again first: a root back from a freeze (SIGSTOP) has lost
        # its lease, and must not fence the peers it heard nothing from meanwhile
        if self.decision.is_root and self.root_now():
            self.placer.check()
            self.bridges.check()
            self.group_changes.reach_target()
        self._flow_alarm()

    def _flow_alarm(self) -> None:
        """Flow control held for ``FLOW_ALARM_AFTER`` seconds shows as the ``flow``
        alarm (in the console like the memory alarm; it blocks nothing more).
        Brief episodes under a burst are normal and stay out of the alarm list."""
        now = self.clock()
        if not self.flow.active:
            self._flow_since = None
            self.clear_alarm("flow")
            return
        if self._flow_since is None:
            self._flow_since = now
        elif now - self._flow_since >= FLOW_ALARM_AFTER:
            kinds = sorted({cause.partition(":")[0] for cause in self.flow.causes})
            self.raise_alarm("flow", f"flow control: publishers paced ({', '.join(kinds)} behind)")

    def status(self) -> dict[str, Any]:
        """Membership's status (``operations.status``) with the planes' added."""
        out = self.operations.status()
        proxy = self.queues.proxy
        out.update(
            {
                "state_seq": self.wiring.last_seq,
                "state_term": self.state_term(),
                "term": self.standing.term.number,
                "state_log": len(self.wiring.log),
                "synced_with": self.wiring.synced_root,
                "pending_changes": len(self.wiring.pending),
                "session": None
                if proxy.session is None
                else {"root": proxy.session.peer, "epoch": proxy.session.epoch},
                "sessions": {spid: s.epoch for spid, s in sorted(proxy.sessions.items())},
                "owned_queues": sorted(q.name for q in self.queues.shared_queues() if q.local),
                "proxied_consumers": len(proxy.by_tag),
                "remote_consumers": sum(len(c) for c in self.queues.owner_side.consumers.values()),
                "replication": self.queues.stream.describe(),
                "handovers": self.queues.handovers.describe(),
                "copies": self.queues.copies.describe(),
                "unsettled_forwards": {
                    spid: len(out.unsettled)
                    for spid, out in self.queues.transport.outbound.items()
                    if out.unsettled
                },
                "flow": {
                    "causes": self.flow.describe(),
                    "paused_connections": len(self.flow.paused),
                    "episodes": dict(self.flow.episodes),
                },
                "lanes": self.lanes_status(),
            }
        )
        return out

    def lanes_status(self) -> dict[str, dict[str, Any]]:
        """Per peer: its link's lanes (backlog bytes), unsettled forwards to it and,
        on the root, how far behind it is as a replica. One row per server, as the
        other views (``operations.servers``): a restarted peer's old spid has none."""
        replicas = self.queues.stream.replicas
        seq = self.queues.stream.seq
        out: dict[str, dict[str, Any]] = {}
        for peer in servers(self)[0]:
            link = self.link_to(peer.spid)
            outbound = self.queues.transport.outbound.get(peer.spid)
            replica = replicas.get(peer.spid)
            out[peer.spid] = {
                **(link.describe() if link is not None else {"state": "down"}),
                "unsettled": len(outbound.unsettled) if outbound is not None else 0,
                "replica_lag": None if replica is None else seq - replica.acked,
            }
        return out
