"""Links and peer records: the part of membership that links to the known hosts and
learns its peers from the links (``Membership`` mixes this in, as ``Admission``).

An outgoing link per known host (``add_link``), and what its coming up says: a
peer (by spid), ourselves (a known host that is this server: *listed*), a
duplicate (another name of a linked peer), or a host's workers to link to
(``_discovered``, a cluster of hosts). A new set of known hosts relinks
(``set_known``: the root ordered a change of the members, or the console pushed
a file). A link that goes down may mean its peer has ended (``check_gone``);
earlier runs of restarted servers are forgotten after a bound
(``forget_superseded``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from brokerd.cluster import probes
from brokerd.cluster.link import Link, link_heartbeat
from brokerd.cluster.partition import ended_hosts
from brokerd.cluster.peers import Peer, server_key

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership

log = logging.getLogger("brokerd.cluster")

#: heartbeat timeouts a superseded run stays remembered after it was last heard
#: (``forget_superseded``): its queues' failover reads its record meanwhile
FORGET_AFTER = 10


class Linking:
    """Outgoing links and the peers they find (mixed into ``Membership``)."""

    def add_link(self: Membership, address: str) -> None:
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
            ssl_context=self.link_tls.context(self.address) if self.link_tls else None,
            # a worker's link to a known host: whichever worker answers says who it is
            discovery=self.hostgroup is not None and address in self.known,
            heartbeat=link_heartbeat(self.config.heartbeat_timeout),
        )
        self.links[address] = link
        link.start()

    # -- links -------------------------------------------------------------------

    def _link_up(self: Membership, link: Link) -> None:
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
        if self.hostgroup is not None and self._discovered(link, spid):
            return
        peer = self._peer(spid)
        self.reached.add(link.address)
        if link.address not in peer.aliases:
            self._log_restart(peer, link.address)
        peer.aliases.add(link.address)
        peer.gone = False
        if peer.link is not None and peer.link is not link and peer.link.up:
            log.info(
                "link duplicate address=%s peer=%s kept=%s", link.address, spid, peer.link.address
            )
            self._retire(link, "duplicate")
            return
        peer.link = link
        self.clear_alarm(f"link:{link.address}")
        log.info("link up address=%s peer=%s", link.address, spid)
        self.heartbeat.send_status(link)
        self.link_ready(spid)

    def _discovered(self: Membership, link: Link, spid: str) -> bool:
        """A worker's link to a known host (a host's client port) reached the worker
        the kernel chose: that says whose host the name is, and lists every worker
        of it, each of which we link to by its own port (``hostgroup.py``). The
        link itself only discovers: it is retired, and never carries messages (a
        reconnection may land on another worker)."""
        group = self.hostgroup
        assert group is not None
        if link.address not in self.known:
            return False
        there = str(link.server_properties.get("host") or "")
        if group.is_sibling(there):
            # a known host that is this host: its name is ours, siblings link by socket
            self.own_addresses.add(link.address)
            self.listed = True
            self._retire(link, "own host")
            return True
        peer = self._peer(spid)
        self.reached.add(link.address)
        peer.aliases.add(link.address)
        workers = link.server_properties.get("host_links")
        for address in workers if isinstance(workers, list) else ():
            if isinstance(address, str) and address and not group.own_link(address):
                self.add_link(address)
        log.info("link discovered host=%s at %s: %s", there, link.address, workers)
        self._retire(link, "discovery")
        return True

    def set_known(self: Membership, known: set[str], checksum: str) -> tuple[set[str], set[str]]:
        """Link by a new set of known hosts (the root ordered a change, or the console
        pushed a new file): links to the added, none to the removed. Returns them."""
        removed, added = self.known - known, known - self.known
        self.known, self.checksum = known, checksum
        if self.address in known:
            # named by the address it was admitted as (or started with): listed at
            # once, not only once a link of its own has come back to it
            self.own_addresses.add(self.address)
        self.listed = bool(self.own_addresses & known)
        for address in removed:
            link = self.links.pop(address, None)
            if link is None:
                continue
            for peer in self.peers.values():
                if peer.link is link:
                    peer.link = None
            self.spawn(link.stop())
        for address in added:
            if address not in self.own_addresses:
                self.add_link(address)
        self.clear_alarm("config-mismatch")
        return removed, added

    def _retire(self: Membership, link: Link, why: str) -> None:
        link.state = why
        self.links.pop(link.address, None)
        self.links[f"{link.address}#{why}"] = link
        task = asyncio.get_running_loop().create_task(link.stop())
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        link.state = why

    def _link_down(self: Membership, link: Link, reason: str) -> None:
        spid = link.peer_spid
        if spid is not None and spid in self.peers and self.peers[spid].link is link:
            self.peer_lost(spid, f"link down: {reason}")
            self.check_gone(spid)
        if "forgotten" in reason:
            self.raise_alarm("forgotten", f"link to {link.address} refused: {reason}")
        elif "checksum" in reason:
            self.raise_alarm("config-mismatch", f"link to {link.address} refused: {reason}")
        elif any(word in reason for word in ("authentication", "ACCESS_REFUSED", "TLS:")):
            self.raise_alarm(f"link:{link.address}", f"link to {link.address}: {reason}")

    def check_gone(self: Membership, spid: str) -> None:
        """Take a peer out of the view at once when its process has ended: our link to
        it is down and its port refused the reconnection, and no connection of its
        to us is open (see the module docstring for why only an ended process does
        this). Anything it says later comes on a new connection, which brings it back."""
        peer = self.peers.get(spid)
        if peer is None or peer.gone or peer.status is None or peer.inbound:
            return
        link = peer.link
        if link is None or link.up or not link.refused:
            return
        peer.gone = True
        log.warning(
            "peer gone spid=%s address=%s: its connections closed and its port refuses new ones",
            spid,
            link.address,
        )
        self.evaluate()

    def probe_links(self: Membership, now: float) -> None:
        """Once a heartbeat: does each link carrying messages deliver on its data lane
        (``probes.py``)? A discovery link has no data lane, a cut one is not probed,
        and nor is a peer that does not say it echoes (an older server)."""
        probes.probe_links(
            (
                peer.link
                for spid, peer in self.peers.items()
                if peer.link is not None
                and not peer.link.discovery
                and spid not in self.cut
                and peer.link.server_properties.get("lane_probes")
            ),
            now,
            self.config.heartbeat_timeout,
        )

    def ended_primaries(self: Membership, now: float) -> int:
        """Known hosts, other than this server, whose process has ended (``partition``)."""
        active = [p for p in self.peers.values() if self.standing.active(p, now)]
        return ended_hosts(self.known - self.own_addresses, self.peers.values(), active, self.links)

    def forget_superseded(self: Membership, now: float) -> list[str]:
        """Drop the records of earlier runs of servers that came back under a new spid,
        and of servers the cluster forgot (issue 43: restarts and scale-downs must not
        grow state). A run is forgotten once it has
        been silent ``FORGET_AFTER`` heartbeat timeouts, holds no link of its own, and nothing
        names it any more (``record_needed``: an owner's queues, a fence under way,
        a bridge). Its process has ended: a newer one listens at its address, and a
        spid is never reused, so nothing it could send is lost. Returns the spids
        forgotten."""
        bound = FORGET_AFTER * self.config.heartbeat_timeout
        runs: dict[str, list[Peer]] = {}
        for peer in self.peers.values():
            runs.setdefault(server_key(peer), []).append(peer)
        forgotten = []
        # a server the cluster forgot (``ctl cluster forget``) goes the same way, its
        # last run included: nothing supersedes it, and it may not come back
        gone = {str(f[0]) for f in self.members_record.get("forgotten") or () if f}
        for key in sorted(gone - self.known):
            for old in runs.pop(key, []):
                if not self._forgettable(old, now, bound, old.link is not None and old.link.up):
                    continue
                del self.peers[old.spid]
                self.cut.discard(old.spid)
                forgotten.append(old.spid)
                log.info("peer record forgotten spid=%s address=%s (forgotten)", old.spid, key)
        for group in runs.values():
            if len(group) < 2:
                continue
            group.sort(key=lambda p: p.spid)  # spids sort by start time
            newest = group[-1]
            for old in group[:-1]:
                # links are by address: the newest run's carries on in the same object
                linked = old.link is not None and old.link.up and old.link is not newest.link
                if not self._forgettable(old, now, bound, linked):
                    continue
                del self.peers[old.spid]
                self.cut.discard(old.spid)
                forgotten.append(old.spid)
                log.info(
                    "peer record forgotten spid=%s address=%s (superseded by spid=%s)",
                    old.spid,
                    server_key(old),
                    newest.spid,
                )
        return forgotten

    def _forgettable(self: Membership, old: Peer, now: float, bound: float, linked: bool) -> bool:
        """Silent past ``bound``, with no link or connection of its own, not active, and
        named by nothing: a record that can go."""
        return not (
            now - old.last_seen < bound
            or linked
            or old.inbound
            or self.standing.active(old, now)
            or self.record_needed(old.spid)
        )

    def record_needed(self: Membership, spid: str) -> bool:
        """Something still names the server run ``spid`` (overridden by the controller:
        queues it owns, a fence under way, a bridge placed on it)."""
        return False

    def _log_restart(self: Membership, peer: Peer, address: str) -> None:
        """A new spid at an older one's address: that server restarted. The views
        retire the old spid (``operations.servers``); failover still reads its record."""
        for old in self.peers.values():
            if old is peer or (old.address != address and address not in old.aliases):
                continue
            if old.spid < peer.spid:  # spids sort by start time
                log.warning(
                    "peer restarted address=%s spid=%s replaces spid=%s (retired from the views)",
                    address,
                    peer.spid,
                    old.spid,
                )

    def _peer(self: Membership, spid: str) -> Peer:
        peer = self.peers.get(spid)
        if peer is None:
            peer = self.peers[spid] = Peer(spid)
        return peer
