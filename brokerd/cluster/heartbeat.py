"""The heartbeat: this server's Cluster.Status, when it goes out and to whom.

``Heartbeat`` is an object that ``membership.Membership`` has (``heartbeat``).
It owns the heartbeat task and the bookkeeping of what was sent: what our last
broadcast status said (``_told``), when we last asked for answers and when
the planes last ticked. It builds our status (``status_message``), beats
(``beat``: a status every interval, the root's every half interval, the
planes' ``tick`` once an interval), tells peers at once when what they elect
on changed (``tell``), answers a peer that asks (``answer``), and sends to
one link or to every linked peer that is not cut (``send_status``,
``broadcast``, ``send_all``).

Everything it reads of membership (configuration, identity, the peers and
the cut ones, the clocks, the load, the standing, the copy's position, the
wiring's sequence, the links) and the hooks it calls on it (``evaluate``,
``tick``, ``before_send``) come through the ``HeartbeatHost`` protocol.
``Membership`` is the host, and keeps the methods the standing and the
planes call (``status_message``, ``beat``, ``tell``, ``broadcast``,
``_send_all``, ``_send_status_all``) as delegates to this object.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.cluster import messages
from brokerd.cluster.messages import Root, Status

if TYPE_CHECKING:
    from brokerd.cluster.config import ClusterConfig
    from brokerd.cluster.election import Decision
    from brokerd.cluster.hostgroup import HostGroup
    from brokerd.cluster.link import Link
    from brokerd.cluster.peers import Peer
    from brokerd.cluster.standing import Standing

log = logging.getLogger("brokerd.cluster")


class HeartbeatHost(Protocol):
    """What the heartbeat reads of membership and calls on it (``Membership``
    provides it; the controller overrides the planes' part)."""

    config: ClusterConfig
    spid: str
    type: str
    start_time: float
    checksum: str
    listed: bool
    holds_state: bool
    #: this data directory's node, and the members as held here (``knownhosts``)
    node: str
    members_record: dict[str, Any]
    address: str
    hostgroup: HostGroup | None
    peers: dict[str, Peer]
    cut: set[str]
    clock: Callable[[], float]
    wall: Callable[[], float]
    load: Callable[[], dict[str, Any]]
    standing: Standing

    def evaluate(self) -> Decision: ...
    def tick(self) -> None: ...
    def probe_links(self, now: float) -> None: ...
    def forget_superseded(self, now: float) -> list[str]: ...
    def copy_complete(self) -> bool: ...
    def copy_position(self) -> tuple[str, int] | None: ...
    def fenced_copies(self) -> dict[str, dict[str, list[Any]]]: ...
    def recovered_copies(self) -> dict[str, int]: ...
    def state_seq(self) -> int: ...
    def state_source(self) -> str | None: ...
    def state_term(self) -> int: ...
    def link_to(self, spid: str | None) -> Link | None: ...
    def before_send(self, spid: str) -> None: ...


class Heartbeat:
    """The statuses of one server: built, timed and sent over its host's links."""

    def __init__(self, host: HeartbeatHost) -> None:
        self.host = host
        #: what our last broadcast status said (vote, role, candidacy, root, checksum)
        self._told: tuple[Any, ...] = ()
        self._asked_at = float("-inf")
        self._last_tick = float("-inf")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def status_message(self, *, ask: bool = False) -> Status:
        """Our status now; ``ask`` asks every receiver to answer with theirs at once."""
        host = self.host
        now = host.clock()
        wall = host.wall()
        copy = host.copy_position()
        host.standing.record_sent(wall, now)
        return Status(
            spid=host.spid,
            type=host.type,
            start_time=host.start_time,
            checksum=host.checksum,
            root_enabled=host.standing.candidate,
            vote=host.standing.decision.vote,
            is_root=host.standing.role_root,
            listed=host.listed,
            address=host.address,
            peers=[p.spid for p in host.peers.values() if host.standing.active(p, now)],
            load=host.load(),
            state_seq=host.state_seq(),
            state_source=host.state_source(),
            state_term=host.state_term(),
            term=host.standing.term.number,
            term_for=host.standing.term.backs,
            sent_at=wall,
            echo={
                p.spid: (p.status.sent_at, round(wall - p.received_at, 6))
                for p in host.peers.values()
                if p.status is not None and host.standing.active(p, now)
            },
            root=host.standing.current_root,
            syncing=not host.copy_complete(),
            copy_source=copy[0] if copy is not None else None,
            copy_seq=copy[1] if copy is not None else 0,
            fenced=host.fenced_copies(),
            recovered=host.recovered_copies(),
            reply=ask,
            stopping=host.standing.stopping,
            holds_state=host.holds_state,
            host=host.hostgroup.host_id if host.hostgroup is not None else "",
            host_address=host.hostgroup.host_address if host.hostgroup is not None else "",
            worker=host.hostgroup.index if host.hostgroup is not None else 0,
            node=host.node,
            members=host.members_record,
        )

    async def _run(self) -> None:
        while True:
            try:
                pause = self.beat()
            except Exception:  # the heartbeat must outlive any single bad peer
                log.exception("heartbeat failed")
                pause = self.host.config.heartbeat_interval
            await asyncio.sleep(pause)

    def beat(self) -> float:
        """One heartbeat; returns the seconds until the next. Statuses go out every
        interval, the root's every half interval, so that its followers never miss
        it for more than half an interval: a root paused for less than the timeout
        minus half an interval is still active for them when it resumes. The root
        asks for answers, which keeps its lease's echoes fresh."""
        host = self.host
        host.evaluate()
        now = host.clock()
        interval = host.config.heartbeat_interval
        if now - self._last_tick >= 0.9 * interval:
            self._last_tick = now
            host.tick()
            host.probe_links(now)
            host.forget_superseded(now)
        self.send_status_all(now, ask=host.standing.elected or host.standing.suspect(now))
        return interval / 2 if host.standing.role_root else interval

    def tell(self, now: float, *, ask: bool) -> None:
        """Send our status at once when what peers elect on changed (vote, role,
        candidacy, the root we recognise), or, at most every quarter interval,
        when we need answers (a root renewing its lease, a suspected cut)."""
        if self._telling() != self._told or (
            ask and now - self._asked_at >= self.host.config.heartbeat_interval / 4
        ):
            self.send_status_all(now, ask=ask)

    def send_status_all(self, now: float, *, ask: bool) -> None:
        self._told = self._telling()
        if ask:
            self._asked_at = now
        self.broadcast(self.status_message(ask=ask))

    def _telling(self) -> tuple[Any, ...]:
        """What peers elect on, as our status says it now (see ``_told``)."""
        s = self.host.standing
        return (
            s.decision.vote,
            s.role_root,
            s.candidate,
            s.current_root,
            self.host.checksum,
            s.term,
        )

    def answer(self, peer: Peer) -> None:
        """A peer asked for our status: send it to that peer only (an answer never
        asks back, so two askers cannot echo each other forever)."""
        host = self.host
        now = host.clock()
        if now - peer.answered_at < host.config.heartbeat_interval / 8:
            return
        link = host.link_to(peer.spid)
        if link is not None:
            peer.answered_at = now
            host.before_send(peer.spid)
            link.post(*messages.encode(self.status_message()))

    def send_status(self, link: Link) -> None:
        kind, body = messages.encode(self.status_message())
        link.post(kind, body)

    def broadcast(self, message: Status | Root) -> None:
        self.send_all(*messages.encode(message))

    def send_all(self, kind: str, body: bytes) -> None:
        """Send one message to every linked peer (not to cut ones)."""
        host = self.host
        for peer in list(host.peers.values()):
            if peer.link is not None and peer.link.up and peer.spid not in host.cut:
                host.before_send(peer.spid)
                peer.link.post(kind, body)
