"""Admission: the connection hooks membership answers (``Membership`` mixes this in).

A link is admitted only if it logs in as the cluster user on the cluster vhost,
with the cluster's known-hosts checksum (or, while the two sides hold members of
different versions, the same settings: ``_catching_up``) and a spid (and, over
mutual TLS, a certificate from the cluster CA), from no server the cluster
forgot (``knownhosts``): its connection is then recorded as the peer's,
and an unknown server that linked to us is linked back. A client connection is
refused on the cluster user or another vhost; while the cluster has no root it
waits in connection.open (DESIGN.md), unless this server is detached or
partitioned, which refuse at once with 320 so the client goes elsewhere.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerd.cluster.election import PRIMARY, SECONDARY
from brokerd.cluster.messages import LINK_PROPERTY
from brokerd.model.errors import (
    ACCESS_REFUSED,
    CONNECTION_FORCED,
    NOT_ALLOWED,
    ConnectionError_,
)
from brokerd.protocol.hooks import Wait

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.protocol.connection import Connection

log = logging.getLogger("brokerd.cluster")


class Admission:
    """The admission hooks: ``admit``, ``login_refused`` and ``closed``."""

    def admit(self: Membership, conn: Connection) -> Wait | None:
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
        away = self.standing.away_reason
        if away is not None:
            # waiting here would last as long as the cut: send the client elsewhere now
            raise ConnectionError_(CONNECTION_FORCED, f"cluster: {away}")
        if not self.standing.ready:
            return Wait(
                f"cluster not ready: {self.standing.not_ready_reason}", self.config.open_timeout
            )
        return None

    def _admit_link(self: Membership, conn: Connection, props: dict[str, Any]) -> None:
        spid = str(props.get("spid", ""))
        if conn.user.name != self.config.user:
            raise ConnectionError_(NOT_ALLOWED, "cluster links must log in as the cluster user")
        if self.link_tls is not None:
            refused = self.link_tls.check(conn, spid)
            if refused:
                self.raise_alarm(f"inbound-tls:{conn.peer[0]}", refused)
                raise ConnectionError_(ACCESS_REFUSED, refused)
        if conn.vhost.name != self.config.vhost:
            raise ConnectionError_(NOT_ALLOWED, "cluster links must use the cluster vhost")
        theirs = str(props.get("checksum", ""))
        if theirs != self.checksum and not _catching_up(self, props):
            text = (
                f"cluster checksum mismatch: link from {spid or conn.name} has {theirs}, "
                f"this server has {self.checksum} (known_hosts differ)"
            )
            self.raise_alarm("config-mismatch", text)
            raise ConnectionError_(NOT_ALLOWED, text)
        if not spid:
            raise ConnectionError_(NOT_ALLOWED, "cluster link without a spid")
        callback = str(props.get("callback") or "")
        node = str(props.get("node") or "")
        forgotten = self.forgotten(callback, node, props.get("member") is True)
        if forgotten:
            log.warning("link from %s refused: %s", callback or conn.name, forgotten)
            raise ConnectionError_(NOT_ALLOWED, forgotten)
        self.inbound[conn.id] = spid
        self.lanes[conn.id] = "control" if props.get("lane") == "control" else "data"
        if spid == self.spid:
            return None
        peer = self._peer(spid)
        peer.inbound.add(conn.id)
        peer.gone = False
        peer.type = SECONDARY if props.get("type") == SECONDARY else PRIMARY
        start_time = props.get("start_time")
        if isinstance(start_time, int | float) and not isinstance(start_time, bool):
            peer.start_time = float(start_time)
        peer.node = node
        if callback and peer.address != callback:
            self._log_restart(peer, callback)
        peer.address = callback
        if callback:
            peer.aliases.add(callback)
        back = callback
        if self.hostgroup is not None and self.hostgroup.is_sibling(props.get("host")):
            back = str(props.get("local") or "")  # a sibling: by its socket
        stale = self.links.get(back)
        if stale is not None and not stale.up:
            stale.retry_now()  # it was backing off: the peer is evidently back
        if (peer.link is None or not peer.link.up) and back and back not in self.links:
            # an unknown server linked to us (a secondary, a new primary): link back
            log.info("link back peer=%s callback=%s", spid, back)
            self.add_link(back)
        return None

    def forgotten(self: Membership, address: str, node: str, member: bool) -> str | None:
        """Why a server at ``address`` with ``node`` is refused as one the cluster
        forgot (None: it is not); the controller's members know."""
        return None

    def login_refused(self: Membership, conn: Connection, reason: str) -> None:
        if isinstance(conn.client_properties.get(LINK_PROPERTY), dict):
            self.raise_alarm(
                f"inbound-auth:{conn.peer[0]}",
                f"cluster link from {conn.name} refused: {reason} (wrong cluster secret?)",
            )

    def closed(self: Membership, conn: Connection) -> None:
        spid = self.inbound.pop(conn.id, None)
        lane = self.lanes.pop(conn.id, "data")
        if spid is not None and spid in self.peers:
            self.peers[spid].inbound.discard(conn.id)
            if self._carrier.get((spid, lane), conn.id) == conn.id:
                # the link that carried its messages (not a duplicate being retired)
                self._carrier.pop((spid, lane), None)
                self.peer_lost(spid, "its link to this server closed")
            self.check_gone(spid)


def _catching_up(members: Membership, props: dict[str, Any]) -> bool:
    """A link whose known-hosts checksum differs because one side's members are of
    another version (the root ordered a change the other has not applied yet, or a
    joining server still has the file's): it may link, and the one behind takes the
    latest; the settings the checksum also covers must still agree."""
    version = props.get("members_version", 0)
    return (
        isinstance(version, int)
        and version != members.members_version
        and props.get("settings") == members.config.settings_checksum
    )
