"""Operator commands on cluster membership: root enable/disable, live reconfiguration,
fault injection, and the status that ``brokerd ctl status`` and the console show.

A mixin of ``ClusterController`` over ``Membership``'s state, kept apart so that
the election module stays about the election.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.election import PRIMARY

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership

    _Base = Membership
else:
    _Base = object

log = logging.getLogger("brokerd.cluster")


class OperatorCommands(_Base):
    """What operators ask of a server's membership (ctl, console commands, dumps)."""

    def set_root_enabled(self, enabled: bool) -> dict[str, Any]:
        if self.type != PRIMARY:
            raise ValueError("a secondary server is never root")
        if self.root_enabled != enabled:
            self.root_enabled = enabled
            log.warning("root %s spid=%s", "enabled" if enabled else "disabled", self.spid)
            # a disabled root releases here and says so with its status at once; the
            # others vote for its successor at once too (statuses go out on change),
            # so the hand-over takes a few link round trips
            self.evaluate()
        return {"root_enabled": self.root_enabled, "is_root": self.decision.is_root}

    def reconfigure(self, config: ClusterConfig) -> dict[str, Any]:
        """Apply a new cluster configuration live (the console's config.apply):
        heartbeat timing at the next beat, known hosts by linking to the new ones
        and dropping links to the removed. Name, vhost, user and secret are read at
        start only; a change to them needs a restart."""
        applied = []
        old = self.config
        self.config = config
        if (old.heartbeat_interval, old.heartbeat_timeout, old.open_timeout) != (
            config.heartbeat_interval,
            config.heartbeat_timeout,
            config.open_timeout,
        ):
            applied.append("heartbeat")
        known = {str(h) for h in config.known_hosts}
        if known != self.known:
            removed, added = self.known - known, known - self.known
            self.known, self.checksum = known, config.checksum
            self.listed = bool(self.own_addresses & known)
            for address in removed:
                link = self.links.pop(address, None)
                if link is None:
                    continue
                for peer in self.peers.values():
                    if peer.link is link:
                        peer.link = None
                self._spawn(link.stop())
            for address in added:
                if address not in self.own_addresses:
                    self._add_link(address)
            self.clear_alarm("config-mismatch")
            applied.append("known_hosts")
            log.warning(
                "cluster known hosts changed checksum=%s added=%s removed=%s",
                self.checksum,
                ",".join(sorted(added)) or "-",
                ",".join(sorted(removed)) or "-",
            )
        if applied:
            self.evaluate()  # a new checksum goes out with a status at once
        return {"applied": applied, "checksum": self.checksum}

    def cut_link(self, spid: str) -> dict[str, Any]:
        if not self.fault_injection:
            raise ValueError("fault injection is off (start brokerd with --enable-fault-injection)")
        # like a network cut: nothing more goes out or comes in on this link, and
        # the peer turns inactive when its last status ages past the timeout
        self.cut.add(spid)
        log.warning("fault cut-link spid=%s", spid)
        # a link that drops what it carries ends the session on this side, as a link
        # that goes down does (the peer hears of it by a Void once the link is back)
        self.peer_lost(spid, "link cut (fault injection)")
        self.evaluate()
        return {"cut": sorted(self.cut)}

    def heal(self) -> dict[str, Any]:
        if not self.fault_injection:
            raise ValueError("fault injection is off (start brokerd with --enable-fault-injection)")
        healed = sorted(self.cut)
        self.cut.clear()
        log.warning("fault heal spids=%s", ",".join(healed) or "-")
        for spid in healed:
            if self.link_to(spid) is not None:
                self.link_ready(spid)  # as if the link had come back up
        return {"healed": healed}

    def status(self) -> dict[str, Any]:
        decision = self.evaluate()
        now = self.clock()
        return {
            "spid": self.spid,
            "type": self.type,
            "is_root": decision.is_root,
            "root": self.root(),
            # root announced but not acting: its lease ran out (a pause), being renewed
            "suspended": self.suspended_since is not None,
            # the root this server cannot reach while others do (clients sent elsewhere)
            "detached": self.detached,
            "ready": self.ready,
            "root_enabled": self.root_enabled,
            "checksum": self.checksum,
            "vote": decision.vote,
            "reason": decision.reason,
            "quorum": decision.quorum,
            "known_primaries": self.known_primaries(now),
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
                    "rtt_ms": p.rtt_ms,
                    "cut": p.spid in self.cut,
                }
                for p in sorted(self.peers.values(), key=lambda p: p.spid)
            ],
            "links": {addr: link.state for addr, link in self.links.items()},
            "echo_rtt": self.echo_rtt.describe(),
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
