"""This server's part in the cluster's members as replicated state (issue 43).

``MemberChanges`` holds the members as this server last applied them
(``knownhosts.KnownHosts``, kept on disk), takes the latest it hears (the
root's ``cluster.members`` entries, and any peer's status: every status
carries the sender's members, so a server that missed an entry, or the
whole cluster after a restart, converges on the latest), and links by it.

On the root it checks and orders changes (``change``, the wiring's hook for
a ``cluster.member-change`` request): one at a time, only once a majority of
the current members hold the current set (``knownhosts.committed``, judged
from their statuses). A join is admitted only from a primary the root hears
and reaches at the address it asks to join under, over a link that logged in
with the cluster's secret (or certificate); a forget only of a server that
is not running. The forgotten server's node is remembered: its links are
refused (``Admission``), with the reason.

A server started with ``--join`` or ``[discovery]`` that is not a member asks
the root to admit it once it holds the root's state (``tick``); until then,
and until it is admitted, it is an unlisted primary: no vote, never root.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brokerd.cluster import knownhosts
from brokerd.cluster.config import DNSDiscovery
from brokerd.cluster.election import PRIMARY
from brokerd.cluster.knownhosts import KnownHosts, MembershipError, Stored, committed
from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring.statelog import Entry
from brokerd.model.errors import PRECONDITION_FAILED, AMQPError, ChannelError

if TYPE_CHECKING:
    from brokerd.cluster.controller import ClusterController
    from brokerd.cluster.peers import Peer

log = logging.getLogger("brokerd.cluster")

JOIN = "join"
FORGET = "forget"
#: heartbeat intervals between two asks to be admitted, after a refusal
JOIN_RETRY = 5


class MemberChanges:
    """The members as this server holds them, their changes, and its own join."""

    def __init__(
        self,
        host: ClusterController,
        data_dir: Path | None,
        *,
        join: str | None = None,
        discovery: DNSDiscovery | None = None,
    ) -> None:
        self.host = host
        self.data_dir = data_dir
        self.stored = knownhosts.load(data_dir) if data_dir is not None else Stored("")
        host.node = self.stored.node
        #: the address this server was told to join through (``--join``; linked at start)
        self.join = join
        host.join = join
        self.discovery = discovery
        self._asking = False
        self._next_ask = 0.0
        self._next_lookup = 0.0
        self._looking = False
        #: addresses forgotten since the last tick (the root shrinks their groups)
        self.leaving: set[str] = set()
        known = self.stored.known
        if known is not None:  # the set last applied here, not the file's: linked at start
            host.members_version, host.members_record = known.version, known.to_dict()
            host.known = set(known.hosts)
            host.checksum = host.config.checksum_of(list(known.hosts))

    # -- what is held ---------------------------------------------------------------

    @property
    def current(self) -> KnownHosts:
        """The members held here (never changed: the cluster file's, or the console's)."""
        known = self.stored.known
        return known if known is not None else KnownHosts.initial(self.host.known)

    @property
    def joining(self) -> bool:
        """This server was told to join and is not a member yet."""
        return (
            (self.join is not None or self.discovery is not None)
            and self.host.type == PRIMARY
            and self.host.hostgroup is None  # a host's workers are members by its name
            and not self.is_member()
        )

    def is_member(self) -> bool:
        hosts = set(self.current.hosts)
        return self.host.address in hosts or bool(self.host.own_addresses & hosts)

    def adopt(self, known: KnownHosts, source: str) -> bool:
        """Take ``known`` if it is later than what is held (the root's entry, or a
        peer's status); True if taken."""
        if not known.newer_than(self.current):
            return False
        old = self.current
        self._take(known)
        # the root takes the forgotten out of the groups naming them (``tick``: not
        # while the entry that forgot them is being ordered)
        self.leaving |= set(old.hosts) - set(known.hosts)
        if self.data_dir is not None:
            knownhosts.save(self.data_dir, self.stored)
        log.warning(
            "cluster members version=%d term=%d from=%s added=%s removed=%s",
            known.version,
            known.term,
            source,
            ",".join(sorted(set(known.hosts) - set(old.hosts))) or "-",
            ",".join(sorted(set(old.hosts) - set(known.hosts))) or "-",
        )
        host = self.host
        host.evaluate()
        host.tell(host.clock(), ask=False)  # the others hear of it at once
        return True

    def _take(self, known: KnownHosts) -> None:
        self.stored = knownhosts.with_known(self.stored, known)
        host = self.host
        host.members_version = known.version
        host.members_record = known.to_dict()
        host.set_known(set(known.hosts), host.config.checksum_of(list(known.hosts)))

    def from_status(self, peer: Peer, record: dict[str, Any]) -> None:
        """A peer's status carries its members: take them if later."""
        if not record:
            return
        try:
            known = KnownHosts.from_dict(record)
        except MembershipError as exc:
            log.warning("members in the status of %s ignored: %s", peer.spid, exc)
            return
        self.adopt(known, peer.spid)

    def applied(self, entry: Entry) -> None:
        """A ``cluster.members`` entry of the root's state log (ordered here, or
        from its stream or its sync)."""
        try:
            known = rep.known_hosts_of(entry)
        except MembershipError as exc:
            log.warning("members entry seq=%d ignored: %s", entry.seq, exc)
            return
        self.adopt(known, f"state seq={entry.seq}")

    def forgotten(self, address: str, node: str, member: bool) -> str | None:
        """Why a link from ``address``/``node`` is refused (None: it is not)."""
        if not self.current.is_forgotten(address, node, claims_membership=member):
            return None
        return (
            f"server {address or '?'} (node {node or '?'}) was forgotten by this cluster "
            f"(members version {self.current.version}): it may not return; remove its "
            "data directory to join again as a new server"
        )

    # -- the root: checking and ordering changes ------------------------------------

    def holding(self) -> set[str]:
        """The members known to hold the current set: this server, and each peer whose
        latest status (within the timeout) carries it."""
        host, current = self.host, self.current
        hosts = set(current.hosts)
        held = ({host.address} | host.own_addresses) & hosts
        now = host.clock()
        for peer in host.peers.values():
            status = peer.status
            if status is None or not host.standing.active(peer, now):
                continue
            record = status.members
            key = (record.get("version", 0), record.get("term", 0)) if record else (0, 0)
            if key == current.key:
                held |= ({peer.address, *peer.aliases} - {""}) & hosts
        return held

    def is_committed(self) -> bool:
        return committed(self.current.hosts, self.holding())

    def change(self, entry: Entry) -> Entry | AMQPError:
        """Root only: the ``cluster.members`` entry a join or forget request leads to,
        or why it is refused."""
        props = dict(entry.props)
        action, address, node = props["action"], props["host"], props["node"]
        current = self.current
        if not self.is_committed():
            held = sorted(self.holding())
            return ChannelError(
                PRECONDITION_FAILED,
                f"members version {current.version} is held by {len(held)} of "
                f"{len(current.hosts)} members only: one change at a time, once a majority "
                "holds the last; try again shortly",
            )
        term = self.host.standing.term.number
        peer = self._peer_at(address)
        try:
            if action == JOIN:
                refused = self._cannot_join(address, peer)
                if refused:
                    return ChannelError(PRECONDITION_FAILED, refused)
                new = current.admitted(address, node or (peer.node if peer else ""), term)
            else:
                if address in ({self.host.address} | self.host.own_addresses):
                    return ChannelError(
                        PRECONDITION_FAILED,
                        f"{address} is the root: hand root over first "
                        "(brokerd ctl root disable on it), then stop it",
                    )
                if peer is not None and self.host.standing.active(peer, self.host.clock()):
                    return ChannelError(
                        PRECONDITION_FAILED,
                        f"{address} is running (spid {peer.spid}): stop it before forgetting it",
                    )
                new = current.without(address, peer.node if peer else "", term)
        except MembershipError as exc:
            return ChannelError(PRECONDITION_FAILED, str(exc))
        log.warning("members change ordered: %s %s (version %d)", action, address, new.version)
        return rep.members_entry(entry.vhost, new, origin=entry.origin)

    def _cannot_join(self, address: str, peer: Peer | None) -> str | None:
        if peer is None or not self.host.standing.active(peer, self.host.clock()):
            return f"the root does not hear a server at {address}: is it running and linked?"
        if peer.type != PRIMARY:
            return f"{address} is a secondary: only primaries are members"
        if peer.link is None or not peer.link.up or peer.address != address:
            return (
                f"the root cannot reach {address} (its link there is not up): check the "
                "joining server's address (--bind) and the network between them"
            )
        return None

    def _peer_at(self, address: str) -> Peer | None:
        """The latest run heard at ``address`` (its callback address or an alias)."""
        found = [
            p for p in self.host.peers.values() if address == p.address or address in p.aliases
        ]
        return max(found, key=lambda p: p.start_time, default=None)

    # -- asking -----------------------------------------------------------------------

    def request(self, action: str, address: str, done: Callable[[Any, Any], None]) -> None:
        """Ask the root to admit or forget ``address`` (``done(error, result)``)."""
        entry = rep.member_change(
            self.host.config.vhost, action, address, self.host.node, self.host.spid
        )
        self.host.wiring.request(entry, done)

    def tick(self) -> None:
        """Each heartbeat: look the cluster up (discovery), and ask to be admitted
        while joining, once this server holds the root's state."""
        host = self.host
        now = host.clock()
        if self.leaving:
            leaving, self.leaving = self.leaving, set()
            if host.decision.is_root and host.root_now():
                for address in sorted(leaving):
                    host.group_changes.forgotten(address)
        if host.hostgroup is not None:
            return  # a cluster of hosts: the known hosts name hosts (no joins yet)
        if self.discovery is not None and not self._looking and now >= self._next_lookup:
            self._looking = True
            host.spawn(self._lookup(self.discovery))
        if not self.joining or self._asking or now < self._next_ask:
            return
        root = host.root()
        if root is None or not host.in_sync(root):
            return
        self._asking = True
        log.warning("asking root=%s to admit this server as %s", root, host.address)
        self.request(JOIN, host.address, self._answered)

    def _answered(self, error: Any, _result: Any) -> None:
        self._asking = False
        host = self.host
        if error is None:
            host.clear_alarm("join")
            log.warning("admitted to the cluster as %s", host.address)
            return
        text = getattr(error, "text", str(error))
        host.raise_alarm("join", f"not admitted to the cluster: {text}")
        self._next_ask = host.clock() + JOIN_RETRY * host.config.heartbeat_interval

    async def _lookup(self, discovery: DNSDiscovery) -> None:
        """Link to every address ``discovery.name`` resolves to (ours turns out to be
        us, and a member already linked by name is collapsed by spid)."""
        host = self.host
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                discovery.name, discovery.port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            log.info("discovery: %s does not resolve: %s", discovery.name, exc)
            infos = []
        finally:
            self._looking = False
            self._next_lookup = host.clock() + discovery.interval
        for info in infos:
            ip = str(info[4][0])
            address = f"[{ip}]:{discovery.port}" if ":" in ip else f"{ip}:{discovery.port}"
            if address not in host.links and address not in host.own_addresses:
                log.info("discovery: %s found at %s", discovery.name, address)
                host.add_link(address)

    async def forget(self, address: str, wait: float) -> dict[str, Any]:
        """``brokerd ctl cluster forget``: ask the root to forget ``address``, then wait
        (at most ``wait`` seconds) until a majority of the remaining members hold
        the new set. Raises ``MembershipError`` with the root's reason."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def done(error: Any, _result: Any) -> None:
            if not answer.done():
                answer.set_result(error)

        self.request(FORGET, address, done)
        try:
            error = await asyncio.wait_for(answer, wait)
        except TimeoutError:
            raise MembershipError("the root did not answer in time: try again") from None
        if error is not None:
            raise MembershipError(getattr(error, "text", str(error)))
        deadline = self.host.clock() + wait
        while address in self.current.hosts or not self.is_committed():
            if self.host.clock() >= deadline:
                break
            await asyncio.sleep(0.05)
        current = self.current
        return {
            "forgotten": address,
            "version": current.version,
            "committed": address not in current.hosts and self.is_committed(),
            "members": list(current.hosts),
        }

    # -- what operators see -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        current = self.current
        return {
            "version": current.version,
            "term": current.term,
            "node": self.host.node,
            "committed": self.is_committed(),
            "forgotten": [{"address": a, "node": n} for a, n in current.forgotten],
            "joining": self.joining,
        }
