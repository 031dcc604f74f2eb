"""Cluster membership: identity, links, peers, admission, receipt and alarms.

``Membership`` owns the identity, the configuration and the known hosts, the
outgoing links, the peers (``peers.Peer``, learnt from link handshakes and
Cluster.Status messages) and the alarms; it receives the cluster messages,
posts to the links (made and read by ``linking.Linking``, mixed in), and answers
the admission hooks (``admission.Admission``, mixed in): links are checked
(cluster user, vhost, known-hosts checksum) and client connections wait in
connection.open while the cluster has no root.

It has two objects that own the rest, each reaching membership through a
protocol membership provides:

- ``standing`` (``standing.Standing``), the election loop over the view this
  builds, owns the election's state: the decision, the announced role, the
  lease, readiness, the root recognised. Membership is both its
  ``StandingHost`` (what it reads) and its ``StandingEvents`` (what it
  announces), and reads that state back through thin properties
  (``decision``, ``ready``, ``current_root``, ``root()``, ``evaluate()``...).
- ``heartbeat`` (``heartbeat.Heartbeat``) owns the heartbeat task and our
  Cluster.Status: building it, when it goes out (every interval, at once on
  a change peers elect on, as an answer) and to whom. Membership is its
  ``HeartbeatHost``; ``status_message``, ``beat``, ``tell``, ``broadcast``
  (and ``_send_all``, which the wiring uses) delegate to it.

The wiring and message planes (``wiring``, ``forwarding``) build on
membership through a few methods: ``root()``, ``link_to(spid)``,
``post(spid, kind, body)`` and the events it calls on itself (``peer_lost``,
``link_ready``, ``root_changed``, ``tick``, ``before_send``), which the
controller overrides.

A peer is known to be *gone* at once, without waiting for the heartbeat
timeout, when every connection with it has closed and its port refuses a new
one (``check_gone``): nothing listens there, so its process has ended. A live
brokerd listens from before it links until after it has stepped down
(``step_down``), and a stopped (SIGSTOP) or busy one still accepts into its
backlog, so a pause never looks like this; neither does a silent network
partition (connections time out, they are not refused). What would is a
firewall that rejects with a reset between two primaries: partition clusters
by dropping packets, never by rejecting them (deploy/runbooks/cluster-root.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokerd.cluster import messages, probes
from brokerd.cluster.admission import Admission
from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.election import PRIMARY, Decision, View
from brokerd.cluster.heartbeat import Heartbeat
from brokerd.cluster.hostgroup import HostGroup
from brokerd.cluster.latency import LatencyWindow
from brokerd.cluster.link import Link
from brokerd.cluster.linking import Linking
from brokerd.cluster.linktls import LinkTLS
from brokerd.cluster.messages import MessageError, Root, Status
from brokerd.cluster.peers import Alarm, Peer
from brokerd.cluster.siblings import Siblings
from brokerd.cluster.standing import Standing
from brokerd.model.broker import Broker
from brokerd.model.errors import (
    access_refused,
)

log = logging.getLogger("brokerd.cluster")


class Membership(Admission, Linking):
    """One server's view of the cluster; its part in the election is ``standing``."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        spid: str,
        server_type: str,
        start_time: float,
        address: str,
        fault_injection: bool = False,
        on_ready_change: Callable[[bool, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        load: Callable[[], dict[str, Any]] | None = None,
        broker: Broker | None = None,
        on_detach: Callable[[str], None] | None = None,
        term_path: Path | None = None,
    ) -> None:
        self.config = config
        #: where the election's term is kept through restarts (``terms.py``)
        self.term_path = term_path
        self.spid = spid
        self.type = server_type
        self.start_time = start_time
        self.address = address
        #: a worker of ``brokerd --workers``: the host's client address (None: ``address``)
        self.client_address: str | None = None
        #: known-host addresses a link of ours reached a peer at since this server started
        #: (a sibling worker's socket that refuses has ended only if it was once up)
        self.reached: set[str] = set()
        #: the workers of this host, as the election counts them (``siblings.py``)
        self.siblings = Siblings(self)
        #: a worker of a host in a cluster of hosts (``hostgroup.py``; None: not one)
        self.hostgroup: HostGroup | None = None
        self.fault_injection = fault_injection
        self.on_ready_change = on_ready_change
        #: close client connections with this reason (this server cannot reach the root)
        self.on_detach = on_detach
        self.clock = clock
        #: wall-clock time for ``sent_at`` (peers compare only values from one clock)
        self.wall = wall
        self.load = load or dict
        self.checksum = config.checksum
        self.known = {str(h) for h in config.known_hosts}
        #: this data directory's node id, and the members as held here once they
        #: changed from the file's (``members.MemberChanges`` sets both)
        self.node = ""
        self.members_record: dict[str, Any] = {}
        #: the members' version (0: the cluster file's set)
        self.members_version = 0
        #: a member's address to join the cluster through (``--join``; links there too)
        self.join: str | None = None
        self.links: dict[str, Link] = {}
        self.peers: dict[str, Peer] = {}
        self.inbound: dict[int, str] = {}
        self.alarms: dict[str, Alarm] = {}
        self.cut: set[str] = set()
        self.root_enabled = server_type == PRIMARY
        self.listed = False
        #: shared wiring was recovered from this server's disk at start (the server
        #: sets it; its statuses say so, for the election after a whole-cluster
        #: restart)
        self.holds_state = False
        #: known-host addresses that turned out to be this server
        self.own_addresses: set[str] = set()
        #: the election loop and its state: this object is its host and its listener
        self.standing = Standing(self, self)
        #: our statuses, built, timed and sent: this object is its host
        self.heartbeat = Heartbeat(self)
        self._sends: set[asyncio.Task[Any]] = set()
        # wiring replication
        self.broker = broker
        #: status-echo round trips (the root's lease rests on them): p50/p99/max
        self.echo_rtt = LatencyWindow(1024)
        #: per peer and lane: the inbound connection its messages last came on
        self._carrier: dict[tuple[str, str], int] = {}
        #: the lane (control or data) of each inbound link connection
        self.lanes: dict[int, str] = {}
        #: links over mutual TLS (None: plain links)
        self.link_tls = LinkTLS(config.tls) if config.tls is not None else None

    # -- the standing, read back (``standing`` owns it; see the module docstring) ----

    @property
    def decision(self) -> Decision:
        return self.standing.decision

    @property
    def acting(self) -> bool:
        return self.standing.acting

    @property
    def role_root(self) -> bool:
        return self.standing.role_root

    @property
    def current_root(self) -> str | None:
        return self.standing.current_root

    @property
    def ready(self) -> bool:
        return self.standing.ready

    @property
    def not_ready_reason(self) -> str:
        return self.standing.not_ready_reason

    @property
    def detached(self) -> str | None:
        return self.standing.detached

    @property
    def stopping(self) -> bool:
        return self.standing.stopping

    def evaluate(self) -> Decision:
        return self.standing.evaluate()

    def root(self, view: View | None = None, now: float | None = None) -> str | None:
        return self.standing.root(view, now)

    def known_primaries(self, now: float) -> int:
        return self.standing.known_primaries(now)

    def step_down(self) -> None:
        self.standing.step_down()

    async def hand_over(self, limit: float | None = None) -> None:
        await self.standing.hand_over(limit)

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        for host in sorted(self.known):  # the file's, or the members held since
            self.add_link(host)
        if self.join is not None:
            self.add_link(self.join)
        if self.hostgroup is not None:
            for socket in self.hostgroup.sibling_sockets():
                self.add_link(socket)
        self.heartbeat.start()
        log.info(
            "cluster start spid=%s type=%s known_hosts=%s checksum=%s",
            self.spid,
            self.type,
            ",".join(sorted(self.known)),
            self.checksum,
        )

    async def stop(self) -> None:
        self.step_down()
        # let the release and the last status reach the peers before the links close
        deadline = self.clock() + 0.5
        while any(link.pending for link in self.links.values()) and self.clock() < deadline:
            await asyncio.sleep(0.005)
        self.heartbeat.cancel()
        await asyncio.gather(*(link.stop() for link in self.links.values()), return_exceptions=True)

    def identity(self) -> dict[str, Any]:
        identity = {
            "spid": self.spid,
            "type": self.type,
            "callback": self.address,
            "start_time": self.start_time,
            "checksum": self.checksum,
            "node": self.node,
            "members_version": self.members_version,
            "settings": self.config.settings_checksum,
            "member": self.listed,
        }
        if self.hostgroup is not None:
            # a sibling links back by our socket; other hosts by ``callback``
            identity |= {"host": self.hostgroup.host_id, "local": self.hostgroup.socket}
        return identity

    # -- messages ---------------------------------------------------------------

    def receive(self, connection_id: int, kind: str, body: bytes) -> None:
        spid = self.inbound.get(connection_id)
        if spid is None:
            raise access_refused("only cluster links may publish to the cluster exchange")
        if spid in self.cut or spid == self.spid:
            return
        self._carrier[(spid, self.lanes.get(connection_id, "data"))] = connection_id
        if kind == probes.PROBE:  # its data lane delivers: echoed on our control lane
            back = self.link_to(spid)
            if back is not None:
                back.post(probes.ECHO, body, control=True)
            return
        if kind == probes.ECHO:
            peer = self.peers.get(spid)
            if peer is not None and peer.link is not None:
                peer.link.probe.echo(body)
            return
        if kind not in messages.KINDS:
            self.receive_plane(spid, kind, body)
            return
        try:
            message = messages.decode(kind, body)
        except MessageError as exc:
            log.warning("cluster message refused from=%s: %s", spid, exc)
            return
        peer = self._peer(spid)
        if isinstance(message, Status):
            now = self.clock()
            if not self.standing.active(peer, now):
                peer.active_since = now
                peer.caught_up = False
            if message.root is not None and message.root == self.standing.current_root:
                peer.caught_up = True
            peer.status = message
            peer.type = message.type
            peer.start_time = message.start_time
            peer.last_seen = now
            peer.received_at = self.wall()
            echo = message.echo.get(self.spid)
            if echo is not None:
                sent_at, held = echo
                rtt = max(0.0, peer.received_at - sent_at - held)
                peer.rtt_ms = round(rtt * 1000, 3)
                self.echo_rtt.add(rtt)
            if message.address:
                peer.address = message.address
            self.status_received(peer.spid, message)
        elif isinstance(message, Root) and peer.status is not None:
            # only the flag: liveness and votes come from statuses, so a stale
            # status is never revived by an announcement
            peer.status.is_root = message.is_root
        self.evaluate()
        if isinstance(message, Status) and message.reply:
            self.heartbeat.answer(peer)

    # -- events: the planes' (overridden by the controller), and the standing's ------

    def link_ready(self, spid: str) -> None:
        """The outgoing link to a peer came up."""

    def status_received(self, spid: str, status: Status) -> None:
        """A peer's Cluster.Status arrived (the wiring compares its state sequence)."""

    def receive_plane(self, spid: str, kind: str, body: bytes) -> None:
        """A message for the wiring or message plane (overridden by the controller)."""
        log.warning("cluster message refused from=%s: unknown kind %r", spid, kind)

    def became_root(self) -> None:
        """This server has just taken root."""

    def root_changed(self, old: str | None, new: str | None) -> None:
        """The root this server recognises changed (None: there is none)."""

    def peer_lost(self, spid: str, why: str) -> None:
        """A peer went inactive, or a link with it dropped: what was in flight with it
        is void."""

    def synced(self, root: str) -> None:
        """This server has just taken the root's wiring."""

    def in_sync(self, root: str) -> bool:
        """Does this server hold the root's wiring (it may serve clients)?"""
        return True

    def waits_on(self, spid: str) -> str | None:
        """A queue owned by ``spid`` this server's clients wait on (the controller's
        queues know; membership alone: none)."""
        return None

    def want_sync(self, root: str) -> None:
        """Ask the root for its wiring."""

    def lease_renewed(self) -> None:
        """A suspended root holds its lease again (overridden by the controller)."""

    def ready_changed(self, ready: bool, reason: str) -> None:
        """This server became ready to serve clients, or stopped being so."""
        if self.on_ready_change is not None:
            self.on_ready_change(ready, reason)

    def detach(self, reason: str) -> None:
        """This server cannot reach the root the others reach: its clients go elsewhere."""
        if self.on_detach is not None:
            self.on_detach(reason)

    # -- the heartbeat (``heartbeat`` owns it; these delegate) ---------------------

    def status_message(self, *, ask: bool = False) -> Status:
        return self.heartbeat.status_message(ask=ask)

    def beat(self) -> float:
        return self.heartbeat.beat()

    def tell(self, now: float, *, ask: bool) -> None:
        self.heartbeat.tell(now, ask=ask)

    def broadcast(self, message: Status | Root) -> None:
        self.heartbeat.broadcast(message)

    def _send_all(self, kind: str, body: bytes) -> None:
        self.heartbeat.send_all(kind, body)

    def _send_status_all(self, now: float, *, ask: bool) -> None:
        self.heartbeat.send_status_all(now, ask=ask)

    # -- the heartbeat's hooks (overridden by the controller) -----------------------

    def tick(self) -> None:
        """Once a heartbeat: retries and timeouts of the planes (overridden)."""

    def copy_complete(self) -> bool:
        """This server's copy of the shared queues is whole (overridden by the controller)."""
        return True

    def copy_position(self) -> tuple[str, int] | None:
        """(the root whose stream its copy follows, the last event applied), for the
        election's preference (overridden by the controller)."""
        return None

    def fenced_copies(self) -> dict[str, dict[str, list[Any]]]:
        """Per fenced owner: this server's copies of its queues, for their failover
        (overridden by the controller)."""
        return {}

    def recovered_copies(self) -> dict[str, int]:
        """Per queue waiting for its last owner: this server's recovered copy's highest
        message id (overridden by the controller)."""
        return {}

    def state_seq(self) -> int:
        """The last wiring entry this server applied (carried in its statuses)."""
        return 0

    def state_source(self) -> str | None:
        """The root whose state log this server follows (None: not synced)."""
        return None

    def state_term(self) -> int:
        """The term of that root when this server synced with it (``terms.py``)."""
        return 0

    # -- posting to links -----------------------------------------------------------

    def data_lane(self, spid: str) -> int | None:
        """The inbound connection the peer's data lane last came on (flow control
        pauses reading it to slow the peer down; its control lane is never paused)."""
        return self._carrier.get((spid, "data"))

    def link_to(self, spid: str | None) -> Link | None:
        """The peer's outgoing link if it is up (and not cut by fault injection). A
        link goes to an address: once a restarted server answers there under a new
        spid, the link is no longer the old spid's (what was meant for the old
        process must not reach the new one)."""
        peer = self.peers.get(spid) if spid else None
        if peer is None or peer.link is None or not peer.link.up or spid in self.cut:
            return None
        if peer.link.peer_spid != spid:
            return None
        return peer.link

    def post(self, spid: str, kind: str, body: bytes) -> bool:
        """Queue one message on the peer's link, in order; False if it is not up."""
        link = self.link_to(spid)
        if link is None:
            return False
        self.before_send(spid)
        return link.post(kind, body)

    def before_send(self, spid: str) -> None:
        """A control message is about to go to ``spid``: what was queued for it before
        must go first (the controller flushes the message plane's batch)."""

    def spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (unit tests of the pure parts)
            coro.close()
            return
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    # -- alarms -----------------------------------------------------------------

    def raise_alarm(self, kind: str, message: str) -> None:
        if kind not in self.alarms or self.alarms[kind].message != message:
            log.error("alarm raised kind=%s message=%s", kind, message)
        self.alarms[kind] = Alarm(kind, message, time.time())

    def clear_alarm(self, kind: str) -> None:
        if self.alarms.pop(kind, None) is not None:
            log.warning("alarm cleared kind=%s", kind)
