"""The cluster controller: links, peers, heartbeats and the root election.

It owns the outgoing links, learns peers from link handshakes and
Cluster.Status messages, runs the pure election (``election.decide``) over
its own view, and answers the connection hooks: links are checked
(cluster user, vhost, known-hosts checksum) and client connections wait in
connection.open while the cluster has no root.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brokerd.cluster import messages
from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.election import PRIMARY, SECONDARY, Decision, Member, View, decide
from brokerd.cluster.link import Link
from brokerd.cluster.messages import LINK_PROPERTY, MessageError, Root, Status
from brokerd.model.errors import NOT_ALLOWED, ConnectionError_, access_refused
from brokerd.model.message import Message
from brokerd.model.muxers import Binding, Muxer
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
    link: Link | None = None
    inbound: set[int] = field(default_factory=set)


@dataclass
class Alarm:
    kind: str
    message: str
    since: float


class ClusterSink(Muxer):
    """The cluster exchange: messages published to it by links go to the controller."""

    type_name = "x-rookery-cluster"

    def __init__(self, controller: ClusterController) -> None:
        super().__init__({})
        self.controller = controller

    def bind(self, binding: Binding) -> None:
        raise access_refused("the cluster exchange cannot be bound")

    def validate(self, routing_key: str, arguments: dict[str, Any]) -> None:
        raise access_refused("the cluster exchange cannot be bound")

    def unbind(self, binding: Binding) -> None:
        return None

    def route(self, message: Message) -> tuple[()]:
        self.controller.receive(message.publisher, message.routing_key, message.body)
        return ()


class ClusterController:
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
        self.decision = Decision(None, False, False, "starting")
        self.ready = False
        self.not_ready_reason = "no root elected yet"
        self.started = clock()
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[Any]] = set()

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

    def _retire(self, link: Link, why: str) -> None:
        link.state = why
        self.links.pop(link.address, None)
        self.links[f"{link.address}#{why}"] = link
        task = asyncio.get_running_loop().create_task(link.stop())
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        link.state = why

    def _link_down(self, link: Link, reason: str) -> None:
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
        peer.start_time = float(props.get("start_time") or 0.0)
        callback = str(props.get("callback") or "")
        peer.address = callback
        if callback:
            peer.aliases.add(callback)
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

    # -- messages ---------------------------------------------------------------

    def receive(self, connection_id: int, kind: str, body: bytes) -> None:
        spid = self.inbound.get(connection_id)
        if spid is None:
            raise access_refused("only cluster links may publish to the cluster exchange")
        if spid in self.cut or spid == self.spid:
            return
        try:
            message = messages.decode(kind, body)
        except MessageError as exc:
            log.warning("cluster message refused from=%s: %s", spid, exc)
            return
        peer = self._peer(spid)
        if isinstance(message, Status):
            peer.status = message
            peer.type = message.type
            peer.start_time = message.start_time
            peer.last_seen = self.clock()
            if message.address:
                peer.address = message.address
        elif isinstance(message, Root) and peer.status is not None:
            peer.status.is_root = message.is_root
            peer.last_seen = self.clock()
        self.evaluate()

    # -- election ---------------------------------------------------------------

    def active(self, peer: Peer, now: float) -> bool:
        return (
            peer.status is not None
            and peer.spid not in self.cut
            and now - peer.last_seen < self.config.heartbeat_timeout
        )

    def view(self, now: float) -> View:
        members = []
        sitting = None
        for peer in self.peers.values():
            status = peer.status
            if status is None:
                continue
            active = self.active(peer, now)
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
                    vote=status.vote,
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
        return View(me, tuple(members), len(self.known), sitting)

    def evaluate(self) -> Decision:
        """Re-run the election on the current view; announce and log changes."""
        now = self.clock()
        view = self.view(now)
        decision = decide(view)
        if now - self.started < self.config.heartbeat_timeout:
            # give every known host a chance to link before the first vote,
            # so the cluster forms around its most senior primary
            decision = Decision(None, False, decision.quorum, "starting")
        was_root = self.decision.is_root
        self.decision = decision
        if decision.is_root != was_root:
            log.warning(
                "root %s spid=%s reason=%s",
                "taken" if decision.is_root else "released",
                self.spid,
                decision.reason,
            )
            self._broadcast(Root(self.spid, decision.is_root, decision.reason))
        root = self.root(view, now)
        ready = root is not None
        reason = "" if ready else f"no root ({decision.reason})"
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
            sent_at=time.time(),
        )

    async def _heartbeat(self) -> None:
        while True:
            try:
                self.evaluate()
                kind, body = messages.encode(self.status_message())
                for peer in list(self.peers.values()):
                    if peer.link is not None and peer.link.up and peer.spid not in self.cut:
                        self._spawn(peer.link.send(kind, body))
            except Exception:  # the heartbeat must outlive any single bad peer
                log.exception("heartbeat failed")
            await asyncio.sleep(self.config.heartbeat_interval)

    def _send_status(self, link: Link) -> None:
        kind, body = messages.encode(self.status_message())
        self._spawn(link.send(kind, body))

    def _broadcast(self, message: Status | Root) -> None:
        kind, body = messages.encode(message)
        for peer in self.peers.values():
            if peer.link is not None and peer.link.up and peer.spid not in self.cut:
                self._spawn(peer.link.send(kind, body))

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

    # -- operator commands --------------------------------------------------------------

    def set_root_enabled(self, enabled: bool) -> dict[str, Any]:
        if self.type != PRIMARY:
            raise ValueError("a secondary server is never root")
        if self.root_enabled != enabled:
            self.root_enabled = enabled
            log.warning("root %s spid=%s", "enabled" if enabled else "disabled", self.spid)
            self.evaluate()
            self._broadcast(self.status_message())
        return {"root_enabled": self.root_enabled, "is_root": self.decision.is_root}

    def cut_link(self, spid: str) -> dict[str, Any]:
        if not self.fault_injection:
            raise ValueError("fault injection is off (start brokerd with --enable-fault-injection)")
        self.cut.add(spid)
        log.warning("fault cut-link spid=%s", spid)
        self.evaluate()
        return {"cut": sorted(self.cut)}

    def heal(self) -> dict[str, Any]:
        if not self.fault_injection:
            raise ValueError("fault injection is off (start brokerd with --enable-fault-injection)")
        healed = sorted(self.cut)
        self.cut.clear()
        log.warning("fault heal spids=%s", ",".join(healed) or "-")
        return {"healed": healed}

    def status(self) -> dict[str, Any]:
        decision = self.evaluate()
        now = self.clock()
        return {
            "spid": self.spid,
            "type": self.type,
            "is_root": decision.is_root,
            "root": self.root(),
            "ready": self.ready,
            "root_enabled": self.root_enabled,
            "checksum": self.checksum,
            "vote": decision.vote,
            "reason": decision.reason,
            "quorum": decision.quorum,
            "listed": self.listed,
            "known_hosts": sorted(self.known),
            "peers": [
                {
                    "spid": p.spid,
                    "type": p.type,
                    "active": self.active(p, now),
                    "address": p.address,
                    "aliases": sorted(p.aliases),
                    "root_enabled": p.status.root_enabled if p.status else None,
                    "is_root": bool(p.status and p.status.is_root),
                    "vote": p.status.vote if p.status else None,
                    "link": p.link.state if p.link else None,
                    "last_seen_age": None if p.status is None else round(now - p.last_seen, 3),
                    "cut": p.spid in self.cut,
                }
                for p in sorted(self.peers.values(), key=lambda p: p.spid)
            ],
            "links": {addr: link.state for addr, link in self.links.items()},
            "alarms": [
                {"kind": a.kind, "message": a.message, "since": a.since}
                for a in self.alarms.values()
            ],
        }

    def summary(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "role": ("root" if self.decision.is_root else self.type),
            "root": self.root(),
            "peers_active": sum(self.active(p, now) for p in self.peers.values()),
            "peers_known": len(self.peers),
            "checksum": self.checksum,
            "ready": self.ready,
        }
