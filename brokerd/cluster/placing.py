"""The root's placement duty: owners for classic shared queues (issue 23).

The rules are ``queues.placement``'s; this applies them as root and orders
what they decide in the state log, so every server places the queue alike:

- **on declare** the root gives a classic queue its owner before ordering the
  declare (``x-queue-master-locator``/``x-queue-leader-locator``: the
  declaring primary by default, else the primary owning the fewest); the
  entry carries the owner (``Entry.spid``);
- **an owner lost** (inactive past the heartbeat timeout, or gone): its
  transient classic queues are deleted for the whole cluster, as RabbitMQ's
  are with their node; its durable ones become unavailable (owner "", home:
  the lost server's address) and wait for it;
- **an owner back**: a primary active at a lost owner's address (the same
  server restarted, under a new spid) owns its durable queues again.

The root checks at every tick, after being root for a heartbeat timeout (a
new root has heard every live primary by then), and at once when membership
reports a peer inactive.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from brokerd.cluster.election import PRIMARY
from brokerd.cluster.queues.placement import CLASSIC, choose_owner, kind_of, locator_of
from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring import statelog as sl

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.cluster.plane.forwarding import MessagePlane
    from brokerd.cluster.queues.shared import SharedQueue
    from brokerd.cluster.wiring.replication import WiringReplication
    from brokerd.cluster.wiring.statelog import Entry

log = logging.getLogger("brokerd.cluster.placing")


class Placer:
    """Places classic shared queues, as root."""

    def __init__(self, members: Membership, plane: MessagePlane, wiring: WiringReplication) -> None:
        self.members = members
        self.plane = plane
        self.wiring = wiring
        #: when this server last became root (None: it is not)
        self.root_since: float | None = None

    def primaries(self) -> list[tuple[str, str]]:
        """The live primaries, (spid, address), in seniority order."""
        members = self.members
        now = members.clock()
        live = []
        if members.type == PRIMARY:
            live.append((members.start_time, members.spid, members.address))
        for peer in members.peers.values():
            status = peer.status
            if status is not None and status.type == PRIMARY and members.standing.active(peer, now):
                live.append((peer.start_time, peer.spid, peer.address))
        return [(spid, address) for _t, spid, address in sorted(live)]

    def place_declare(self, entry: Entry) -> Entry:
        """A shared queue's declare, about to be ordered: a classic queue gets its owner.
        One placed already keeps it (a redeclare: the placement entries decide); so
        does a declare that names one (recovered wiring)."""
        if entry.op != sl.QUEUE_DECLARE or entry.spid:
            return entry
        vhost = self.plane.vhost()
        if getattr(vhost.queues.get(entry.name) if vhost is not None else None, "epoch", 0):
            return entry
        props = dict(entry.props)
        arguments = dict(props.get("arguments") or ())
        durable = bool(props.get("durable"))
        if kind_of(durable, arguments, self.plane.default_queue_type) != CLASSIC:
            return entry
        spids = [spid for spid, _address in self.primaries()]
        if not spids:
            return entry  # no primary is live: the declare is refused by the root's checks
        owned = Counter(q.owner for q in self.plane.placed_queues() if q.owner is not None)
        owner = choose_owner(locator_of(arguments), entry.origin, spids, owned)
        log.info("queue=%s placed on owner=%s", entry.name, owner)
        return replace(entry, spid=owner)

    def root_changed(self, is_root: bool) -> None:
        self.root_since = self.members.clock() if is_root else None

    def check(self, lost: str | None = None) -> None:
        """Order what owners coming and going change (root only); ``lost``: a peer
        membership just found inactive."""
        if self.root_since is None or not self.members.decision.is_root:
            return
        settled = self.members.clock() - self.root_since >= self.members.config.heartbeat_timeout
        if lost is None and not settled:
            return
        live = self.primaries()
        live_spids = {spid for spid, _a in live}
        by_address = {address: spid for spid, address in live if address}
        for queue in self.plane.placed_queues():
            owner = queue.owner
            if owner is not None and (owner == lost or (settled and owner not in live_spids)):
                self._lost(queue, owner)
            elif owner is None and queue.home in by_address:
                self._order_place(queue.name, by_address[queue.home], queue.epoch + 1, None)

    def _lost(self, queue: SharedQueue, owner: str) -> None:
        name = queue.name
        if not queue.durable:
            log.warning("owner %s of transient queue=%s lost: the queue goes with it", owner, name)
            self.wiring.order_delete(queue)
            return
        peer = self.members.peers.get(owner)
        home = peer.address if peer is not None and peer.address else owner
        log.warning("owner %s of durable queue=%s lost: unavailable until it returns", owner, name)
        self._order_place(name, None, queue.epoch + 1, home)

    def _order_place(self, name: str, owner: str | None, epoch: int, home: str | None) -> None:
        entry = rep.place_entry(self.members.config.vhost, name, owner, epoch, home)
        self.wiring.order(entry)
