"""Cluster membership: links, peers, heartbeats, admission and the root election.

``Membership`` owns the outgoing links, learns peers from link handshakes and
Cluster.Status messages, runs the pure election (``election.decide``) over
its own view, and answers the admission hooks: links are checked (cluster
user, vhost, known-hosts checksum) and client connections wait in
connection.open while the cluster has no root. The wiring and message planes
(``wiring``, ``forwarding``) build on it through a few methods: ``root()``,
``link_to(spid)``, ``post(spid, kind, body)`` and the events it calls on
itself (``peer_lost``, ``link_ready``, ``root_changed``), which the
controller overrides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brokerd.cluster import messages
from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.election import (
    PRIMARY,
    SECONDARY,
    Decision,
    Member,
    View,
    decide,
    holds_lease,
)
from brokerd.cluster.link import Link
from brokerd.cluster.messages import LINK_PROPERTY, MessageError, Root, Status
from brokerd.model.broker import Broker
from brokerd.model.errors import (
    NOT_ALLOWED,
    ConnectionError_,
    access_refused,
)
from brokerd.protocol.hooks import Wait

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection

log = logging.getLogger("brokerd.cluster")


@dataclass
class Peer:
    spid: str
    type: str = PRIMARY
    start_time: float = 0.0
    address: str = ""
    aliases: set[str] = field(default_factory=set)
    status: Status | None = None
    last_seen: float = float("-inf")
    #: when its statuses started arriving again after a silence (it may not know the root yet)
    active_since: float = float("-inf")
    link: Link | None = None
    inbound: set[int] = field(default_factory=set)
    #: wall-clock time its latest status arrived (for the round-trip echo)
    received_at: float = 0.0
    #: link round-trip time from the echo of our own status, in milliseconds
    rtt_ms: float | None = None


@dataclass
class Alarm:
    kind: str
    message: str
    since: float


class Membership:
    """One server's view of the cluster and its part in the election."""

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
        load: Callable[[], dict[str, Any]] | None = None,
        broker: Broker | None = None,
    ) -> None:
        self.config = config
        self.spid = spid
        self.type = server_type
        self.start_time = start_time
        self.address = address
        self.fault_injection = fault_injection
        self.on_ready_change = on_ready_change
        self.clock = clock
        self.load = load or dict
        self.checksum = config.checksum
        self.known = {str(h) for h in config.known_hosts}
        self.links: dict[str, Link] = {}
        self.peers: dict[str, Peer] = {}
        self.inbound: dict[int, str] = {}
        self.alarms: dict[str, Alarm] = {}
        self.cut: set[str] = set()
        self.root_enabled = server_type == PRIMARY
        self.listed = False
        #: known-host addresses that turned out to be this server
        self.own_addresses: set[str] = set()
        self.decision = Decision(None, False, False, "starting")
        self.ready = False
        self.not_ready_reason = "no root elected yet"
        self.started = clock()
        self._last_eval = 0.0
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[Any]] = set()
        # wiring replication
        self.broker = broker
        #: the root recognised at the last evaluation (root_changed fires on a change)
        self.current_root: str | None = None
        #: peers active at the last evaluation (peer_lost fires when one drops out)
        self._was_active: set[str] = set()
        #: per peer: the inbound connection its messages last came on
        self._carrier: dict[str, int] = {}

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        for host in self.config.known_hosts:
            self._add_link(str(host))
        self._task = asyncio.get_running_loop().create_task(self._heartbeat())
        log.info(
            "cluster start spid=%s type=%s known_hosts=%s checksum=%s",
            self.spid,
            self.type,
            ",".join(sorted(self.known)),
            self.checksum,
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await asyncio.gather(*(link.stop() for link in self.links.values()), return_exceptions=True)

    def identity(self) -> dict[str, Any]:
        return {
            "spid": self.spid,
            "type": self.type,
            "callback": self.address,
            "start_time": self.start_time,
            "checksum": self.checksum,
        }

    def _add_link(self, address: str) -> None:
        if address in self.links:
            return
        link = Link(
            address,
            user=self.config.user,
            secret=self.config.secret,
            vhost=self.config.vhost,
            identity=self.identity,
            on_up=self._link_up,
            on_down=self._link_down,
        )
        self.links[address] = link
        link.start()

    # -- links -------------------------------------------------------------------

    def _link_up(self, link: Link) -> None:
        spid = link.peer_spid
        if spid is None:
            link.drop("peer sent no spid: not a Rookery server")
            return
        if spid == self.spid:
            # a known host that is ourselves: remember it, and never link to it again
            self.own_addresses.add(link.address)
            if link.address in self.known:
                self.listed = True
            log.info("link self address=%s", link.address)
            self._retire(link, "self")
            return
        peer = self._peer(spid)
        peer.aliases.add(link.address)
        if peer.link is not None and peer.link is not link and peer.link.up:
            log.info(
                "link duplicate address=%s peer=%s kept=%s", link.address, spid, peer.link.address
            )
            self._retire(link, "duplicate")
            return
        peer.link = link
        self.clear_alarm(f"link:{link.address}")
        log.info("link up address=%s peer=%s", link.address, spid)
        self._send_status(link)
        self.link_ready(spid)

    def _retire(self, link: Link, why: str) -> None:
        link.state = why
        self.links.pop(link.address, None)
        self.links[f"{link.address}#{why}"] = link
        task = asyncio.get_running_loop().create_task(link.stop())
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        link.state = why

    def _link_down(self, link: Link, reason: str) -> None:
        spid = link.peer_spid
        if spid is not None and spid in self.peers and self.peers[spid].link is link:
            self.peer_lost(spid, f"link down: {reason}")
        if "checksum" in reason:
            self.raise_alarm("config-mismatch", f"link to {link.address} refused: {reason}")
        elif "authentication" in reason or "ACCESS_REFUSED" in reason:
            self.raise_alarm(f"link:{link.address}", f"link to {link.address}: {reason}")

    def _peer(self, spid: str) -> Peer:
        peer = self.peers.get(spid)
        if peer is None:
            peer = self.peers[spid] = Peer(spid)
        return peer

    # -- connection hooks ------------------------------------------------------

    def admit(self, conn: Connection) -> Wait | None:
        link = conn.client_properties.get(LINK_PROPERTY)
        if isinstance(link, dict):
            return self._admit_link(conn, link)
        if conn.user.name == self.config.user:
            raise ConnectionError_(
                NOT_ALLOWED, "the cluster user may only be used by cluster links"
            )
        if conn.vhost.name != self.config.vhost:
            raise ConnectionError_(
                NOT_ALLOWED, f"this cluster serves vhost '{self.config.vhost}' only"
            )
        self.evaluate()
        if not self.ready:
            return Wait(f"cluster not ready: {self.not_ready_reason}", self.config.open_timeout)
        return None

    def _admit_link(self, conn: Connection, props: dict[str, Any]) -> None:
        spid = str(props.get("spid", ""))
        if conn.user.name != self.config.user:
            raise ConnectionError_(NOT_ALLOWED, "cluster links must log in as the cluster user")
        if conn.vhost.name != self.config.vhost:
            raise ConnectionError_(NOT_ALLOWED, "cluster links must use the cluster vhost")
        theirs = str(props.get("checksum", ""))
        if theirs != self.checksum:
            text = (
                f"cluster checksum mismatch: link from {spid or conn.name} has {theirs}, "
                f"this server has {self.checksum} (known_hosts differ)"
            )
            self.raise_alarm("config-mismatch", text)
            raise ConnectionError_(NOT_ALLOWED, text)
        if not spid:
            raise ConnectionError_(NOT_ALLOWED, "cluster link without a spid")
        self.inbound[conn.id] = spid
        if spid == self.spid:
            return None
        peer = self._peer(spid)
        peer.inbound.add(conn.id)
        peer.type = SECONDARY if props.get("type") == SECONDARY else PRIMARY
        start_time = props.get("start_time")
        if isinstance(start_time, int | float) and not isinstance(start_time, bool):
            peer.start_time = float(start_time)
        callback = str(props.get("callback") or "")
        peer.address = callback
        if callback:
            peer.aliases.add(callback)
        stale = self.links.get(callback)
        if stale is not None and not stale.up:
            stale.retry_now()  # it was backing off: the peer is evidently back
        if (peer.link is None or not peer.link.up) and callback and callback not in self.links:
            # an unknown server linked to us (a secondary, a new primary): link back
            log.info("link back peer=%s callback=%s", spid, callback)
            self._add_link(callback)
        return None

    def login_refused(self, conn: Connection, reason: str) -> None:
        if isinstance(conn.client_properties.get(LINK_PROPERTY), dict):
            self.raise_alarm(
                f"inbound-auth:{conn.peer[0]}",
                f"cluster link from {conn.name} refused: {reason} (wrong cluster secret?)",
            )

    def closed(self, conn: Connection) -> None:
        spid = self.inbound.pop(conn.id, None)
        if spid is not None and spid in self.peers:
            self.peers[spid].inbound.discard(conn.id)
            if self._carrier.get(spid, conn.id) == conn.id:
                # the link that carried its messages (not a duplicate being retired)
                self._carrier.pop(spid, None)
                self.peer_lost(spid, "its link to this server closed")

    # -- messages ---------------------------------------------------------------

    def receive(self, connection_id: int, kind: str, body: bytes) -> None:
        spid = self.inbound.get(connection_id)
        if spid is None:
            raise access_refused("only cluster links may publish to the cluster exchange")
        if spid in self.cut or spid == self.spid:
            return
        self._carrier[spid] = connection_id
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
            if not self.active(peer, now):
                peer.active_since = now
            peer.status = message
            peer.type = message.type
            peer.start_time = message.start_time
            peer.last_seen = now
            peer.received_at = time.time()
            echo = message.echo.get(self.spid)
            if echo is not None:
                sent_at, held = echo
                peer.rtt_ms = round(max(0.0, peer.received_at - sent_at - held) * 1000, 3)
            if message.address:
                peer.address = message.address
            self.status_received(peer.spid, message)
        elif isinstance(message, Root) and peer.status is not None:
            # only the flag: liveness and votes come from statuses, so a stale
            # status is never revived by an announcement
            peer.status.is_root = message.is_root
        self.evaluate()

    def status_received(self, spid: str, status: Status) -> None:
        """A peer's Cluster.Status arrived (the wiring compares its state sequence)."""

    def receive_plane(self, spid: str, kind: str, body: bytes) -> None:
        """A message for the wiring or message plane (overridden by the controller)."""
        log.warning("cluster message refused from=%s: unknown kind %r", spid, kind)

    # -- election ---------------------------------------------------------------

    def active(self, peer: Peer, now: float, window: float | None = None) -> bool:
        """Heard within ``window`` (default: the heartbeat timeout). A cut link ages
        out like a real one: its statuses are dropped, what was heard stays valid."""
        window = self.config.heartbeat_timeout if window is None else window
        return peer.status is not None and now - peer.last_seen < window

    @property
    def lease(self) -> float:
        """How recent the votes keeping this server root must be: short enough that
        a cut-off root steps down before its followers' timeout runs out (they may
        have heard it last an interval before the cut), long enough to span more
        than one heartbeat."""
        interval = self.config.heartbeat_interval
        return max(1.2 * interval, self.config.heartbeat_timeout - 1.5 * interval)

    def view(self, now: float, window: float | None = None) -> View:
        members = []
        sitting = None
        for peer in self.peers.values():
            status = peer.status
            if status is None:
                continue
            active = self.active(peer, now, window)
            # a peer heard again only just now voted before it could know the
            # sitting root: count it as abstaining for one timeout
            settled = now - peer.active_since >= self.config.heartbeat_timeout
            if active and status.is_root and (sitting is None or peer.spid < sitting):
                sitting = peer.spid
            members.append(
                Member(
                    spid=peer.spid,
                    type=status.type,
                    start_time=status.start_time,
                    root_enabled=status.root_enabled,
                    checksum=status.checksum,
                    active=active,
                    vote=status.vote if settled else None,
                    listed=status.listed,
                )
            )
        if self.decision.is_root:
            sitting = self.spid
        me = Member(
            spid=self.spid,
            type=self.type,
            start_time=self.start_time,
            root_enabled=self.root_enabled,
            checksum=self.checksum,
            active=True,
            vote=self.decision.vote,
            listed=self.listed,
        )
        return View(me, tuple(members), self.known_primaries(now), sitting)

    def known_primaries(self, now: float) -> int:
        """Distinct servers among the known hosts, the quorum's denominator.

        Names that led to the same server count once: this server's own names,
        and an *active* peer's aliases. Only live evidence merges names (an
        address may since belong to another server), so a listed name that no
        link has resolved yet still counts on its own: never fewer servers than
        there are, only sometimes more, which errs on the safe side."""
        groups = [self.own_addresses & self.known]
        groups += [p.aliases & self.known for p in self.peers.values() if self.active(p, now)]
        # a name claimed by two servers is ambiguous (moved, or a stale record): it merges nothing
        claims = Counter(name for group in groups for name in group)
        merged = (sum(claims[name] == 1 for name in group) for group in groups)
        return len(self.known) - sum(n - 1 for n in merged if n > 1)

    def evaluate(self) -> Decision:
        """Re-run the election on the current view; announce and log changes."""
        now = self.clock()
        if self._last_eval and now - self._last_eval > self.config.heartbeat_timeout:
            # we were frozen (SIGSTOP, a long pause): our view is stale, so abstain
            # until peers have been heard again rather than vote from it
            log.warning(
                "stalled for %.1fs spid=%s: abstaining for a while",
                now - self._last_eval,
                self.spid,
            )
            self.started = now
        self._last_eval = now
        view = self.view(now)
        decision = decide(view)
        if decision.is_root and not holds_lease(self.view(now, self.lease)):
            decision = Decision(
                decision.vote,
                False,
                decision.quorum,
                f"lease: fewer than a quorum of primaries voted for it within {self.lease:.2f}s",
            )
        heard = [m for m in view.members() if m.voter and m.active]
        if self.type == PRIMARY and 2 * len(heard) <= view.known_primaries:
            # hearing too few primaries (just restarted, links still backing off,
            # the minority side of a partition): a vote from this view would only
            # unseat a root we cannot see, so abstain
            decision = Decision(None, False, False, decision.reason)
        if now - self.started < self.config.heartbeat_timeout:
            # give every known host a chance to link before the first vote,
            # so the cluster forms around its most senior primary
            decision = Decision(None, False, decision.quorum, "starting")
        was_root = self.decision.is_root
        self.decision = decision
        if decision.is_root and not was_root:
            self.became_root()
        if decision.is_root != was_root:
            log.warning(
                "root %s spid=%s reason=%s",
                "taken" if decision.is_root else "released",
                self.spid,
                decision.reason,
            )
            self._broadcast(Root(self.spid, decision.is_root, decision.reason))
        root = self.root(view, now)
        active = {p.spid for p in self.peers.values() if self.active(p, now)}
        for spid in self._was_active - active:
            self.peer_lost(spid, "inactive")
        self._was_active = active
        if root != self.current_root:
            old, self.current_root = self.current_root, root
            log.warning("root changed spid=%s from=%s to=%s", self.spid, old, root)
            self.root_changed(old, root)
        if root is not None and root != self.spid and not self.in_sync(root):
            self.want_sync(root)
        in_sync = root is not None and (root == self.spid or self.in_sync(root))
        ready = in_sync
        if root is None:
            reason = self.no_root_reason(view, decision)
        elif not in_sync:
            reason = f"synchronising wiring from root {root}"
        else:
            reason = ""
        if ready != self.ready:
            log.warning(
                "cluster %s spid=%s root=%s %s",
                "ready" if ready else "not ready",
                self.spid,
                root,
                reason,
            )
            self.ready = ready
            self.not_ready_reason = reason
            if self.on_ready_change is not None:
                self.on_ready_change(ready, reason)
        self.not_ready_reason = reason
        return decision

    def no_root_reason(self, view: View, decision: Decision) -> str:
        """Why there is no root, in words that name the cause (the 541 text)."""
        voters = [m for m in view.members() if m.voter and m.active]
        if 2 * len(voters) <= view.known_primaries:
            return (
                f"no root: quorum lost, {len(voters)} of {view.known_primaries} "
                "known primaries reachable"
            )
        if not any(m.root_enabled and m.checksum == self.checksum for m in voters):
            return "no root: root is disabled on every reachable primary"
        if self.type != PRIMARY:
            return "no root: the primaries are electing one"
        return f"no root: {decision.reason}"

    # -- events for the planes built on membership (the controller overrides them) -----

    def became_root(self) -> None:
        """This server has just taken root."""

    def root_changed(self, old: str | None, new: str | None) -> None:
        """The root this server recognises changed (None: there is none)."""

    def peer_lost(self, spid: str, why: str) -> None:
        """A peer went inactive, or a link with it dropped: what was in flight with it
        is void."""

    def link_ready(self, spid: str) -> None:
        """The outgoing link to a peer came up."""

    def synced(self, root: str) -> None:
        """This server has just taken the root's wiring."""

    def in_sync(self, root: str) -> bool:
        """Does this server hold the root's wiring (it may serve clients)?"""
        return True

    def want_sync(self, root: str) -> None:
        """Ask the root for its wiring."""

    def root(self, view: View | None = None, now: float | None = None) -> str | None:
        """The root this server recognises: itself, or an active peer that says it is."""
        if self.decision.is_root:
            return self.spid
        now = self.clock() if now is None else now
        for peer in self.peers.values():
            if peer.status is not None and peer.status.is_root and self.active(peer, now):
                return peer.spid
        return None

    # -- heartbeats ------------------------------------------------------------------

    def status_message(self) -> Status:
        now = self.clock()
        return Status(
            spid=self.spid,
            type=self.type,
            start_time=self.start_time,
            checksum=self.checksum,
            root_enabled=self.root_enabled,
            vote=self.decision.vote,
            is_root=self.decision.is_root,
            listed=self.listed,
            address=self.address,
            peers=[p.spid for p in self.peers.values() if self.active(p, now)],
            load=self.load(),
            state_seq=self.state_seq(),
            sent_at=(wall := time.time()),
            echo={
                p.spid: (p.status.sent_at, round(wall - p.received_at, 6))
                for p in self.peers.values()
                if p.status is not None and self.active(p, now)
            },
        )

    async def _heartbeat(self) -> None:
        while True:
            try:
                self.evaluate()
                self.tick()
                self._broadcast(self.status_message())
            except Exception:  # the heartbeat must outlive any single bad peer
                log.exception("heartbeat failed")
            await asyncio.sleep(self.config.heartbeat_interval)

    def tick(self) -> None:
        """Once a heartbeat: retries and timeouts of the planes (overridden)."""

    def state_seq(self) -> int:
        """The last wiring entry this server applied (carried in its statuses)."""
        return 0

    def _send_status(self, link: Link) -> None:
        kind, body = messages.encode(self.status_message())
        link.post(kind, body)

    def _broadcast(self, message: Status | Root) -> None:
        self._send_all(*messages.encode(message))

    def _send_all(self, kind: str, body: bytes) -> None:
        """Send one message to every linked peer (not to cut ones)."""
        for peer in list(self.peers.values()):
            if peer.link is not None and peer.link.up and peer.spid not in self.cut:
                self.before_send(peer.spid)
                peer.link.post(kind, body)

    def link_to(self, spid: str | None) -> Link | None:
        """The peer's outgoing link if it is up (and not cut by fault injection)."""
        peer = self.peers.get(spid) if spid else None
        if peer is None or peer.link is None or not peer.link.up or spid in self.cut:
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

    def _spawn(self, coro: Any) -> None:
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
