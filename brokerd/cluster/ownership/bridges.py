"""Where the configuration document's bridges run: one server each, placed by the
root in the state log as a queue's owner is (issue 42).

Every server applies the ``bridge.place`` entries (``applied``) and runs the
bridges placed on it while it is part of the cluster (``BridgeService``
asks ``here``). The root, at each check, places every wanted bridge that has
no live primary: on the live primary running the fewest, the eldest first
among equals. A primary found inactive (killed, paused past the timeout, cut
off) or gone (stopped, decommissioned) loses its bridges to the others. Under
``on-confirm`` a move loses nothing: the source broker requeues what the old
runner had not acknowledged once its connection ends, and the new runner
forwards it again (flagged ``x-redelivered``). A server cut off from the root
stops its runners at once (``BridgeService``), so a bridge runs on two
servers only while the root has not yet found the cut-off one inactive.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from brokerd.cluster.wiring import entries as rep

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.cluster.ownership.placer import Placer
    from brokerd.cluster.wiring.replication import WiringReplication
    from brokerd.cluster.wiring.statelog import Entry

log = logging.getLogger("brokerd.cluster.ownership.bridges")

#: a bridge: (vhost, name)
Key = tuple[str, str]


class BridgePlacements:
    """The bridges' placements as this server applied them, and the root's duty of
    placing them."""

    def __init__(self, members: Membership, wiring: WiringReplication, placer: Placer) -> None:
        self.members = members
        self.wiring = wiring
        self.placer = placer
        #: (vhost, name) -> (spid it runs on, "" for none; the placement's epoch)
        self.placed: dict[Key, tuple[str, int]] = {}
        #: the bridges the configuration document defines (the server sets it)
        self.wanted: Callable[[], Iterable[Key]] = tuple
        #: called after a placement is applied here (the server's bridge service)
        self.on_change: Callable[[], None] | None = None

    def applied(self, entry: Entry) -> None:
        """A ``bridge.place`` entry applied (ordered here as root, or from the root's
        state stream, or replayed by a sync)."""
        key = (entry.vhost, entry.name)
        epoch = int(dict(entry.props).get("epoch", 1))
        if self.placed.get(key) == (entry.spid, epoch):
            return
        self.placed[key] = (entry.spid, epoch)
        log.info("bridge=%s vhost=%s placed on %s", entry.name, entry.vhost, entry.spid or "-")
        if self.on_change is not None:
            self.on_change()

    def here(self, key: Key) -> bool:
        """Bridge ``key`` is placed on this server."""
        return self.placed.get(key, ("", 0))[0] == self.members.spid

    def where(self, key: Key) -> str:
        """The server bridge ``key`` is placed on ("" if none)."""
        return self.placed.get(key, ("", 0))[0]

    def check(self) -> None:
        """Root only: place each wanted bridge whose server is not a live primary."""
        members = self.members
        if self.placer.root_since is None or not members.decision.is_root:
            return
        wanted = sorted(self.wanted())
        if not wanted:
            return
        live = [spid for spid, _address in self.placer.primaries()]
        if not live:
            return
        now = members.clock()
        settled = now - self.placer.root_since >= members.config.heartbeat_timeout
        silent = {
            spid
            for spid, peer in members.peers.items()
            if peer.gone or (peer.status is not None and not members.standing.active(peer, now))
        }
        load = Counter(spid for spid, _epoch in self.placed.values() if spid in live)
        for key in wanted:
            spid, epoch = self.placed.get(key, ("", 0))
            if spid in live and spid not in silent:
                continue
            if spid and spid not in silent and not settled:
                continue  # a new root may not have heard that primary yet
            to = min(live, key=lambda s: (load[s], live.index(s)))
            load[to] += 1
            if spid:
                log.warning(
                    "bridge=%s vhost=%s: its server %s is lost, placed on %s",
                    key[1],
                    key[0],
                    spid,
                    to,
                )
            self.wiring.order(rep.bridge_place_entry(key[0], key[1], to, epoch + 1))
