"""The root's placement duty: an owner for every shared queue (issue 23).

The rules are ``queues.placement``'s; this applies them as root and orders
what they decide in the state log, so every server places the queue alike:

- **on declare** the root gives the queue its owner before ordering the
  declare (``x-queue-master-locator``/``x-queue-leader-locator``, or for a
  declare that names none the cluster file's ``queue_leader_locator``: the
  declaring primary by default, else the primary owning the fewest); the
  entry carries the owner (``Entry.spid``). A replicated or quorum queue never
  goes to a fenced server;
- **a classic queue's owner lost** (inactive past the heartbeat timeout, or
  gone): its transient classic queues are deleted for the whole cluster, as
  RabbitMQ's are with their node; its durable ones become unavailable (owner
  "", home: the lost server's address) and wait for it; a primary active at
  that address (the same server restarted, under a new spid) owns them again;
- **a replicated queue's owner lost**: the root fences its stream
  (``server.fence``); each primary that applies the fence stops acking that
  stream and reports its copies' positions in its status (``fenced``). Once
  ``known - known // 2`` primaries besides the owner have (any majority of
  replica acks, hence every confirmed event, meets them), each queue goes to
  the reporter with the furthest copy (a synced one first, then the
  earliest primary), fenced once itself or not: a fenced server is still a
  sound replica of the others. A fenced owner that was only paused streams
  again, under its next generation, once its queues are placed elsewhere;
- **a whole-cluster restart**: the root seeds its state log from its disk and
  gives each durable shared queue back to its last owner by address
  (``recovered``), or leaves it waiting for that server (``home``), a
  replicated one for at most the cluster file's ``recovery_wait``
  (``config.RECOVERY_WAIT``, 30 s, by default). Then it goes to the most complete copy
  that came back: each primary reports its recovered copy's highest message
  id in its status (``recovered``), and once a majority of the known
  primaries has, the highest wins (``_recover_elsewhere``).

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
from brokerd.cluster.hostgroup import peer_host
from brokerd.cluster.ownership import groups
from brokerd.cluster.ownership.moves import Mover
from brokerd.cluster.ownership.rules import choose_owner, group_of, kind_of, locator_of
from brokerd.cluster.queues.kinds import KINDS
from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring import statelog as sl

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.cluster.queues.service import QueueService
    from brokerd.cluster.queues.shared import SharedQueue
    from brokerd.cluster.wiring.replication import WiringReplication
    from brokerd.cluster.wiring.statelog import Entry
    from brokerd.model.errors import AMQPError

log = logging.getLogger("brokerd.cluster.ownership.placer")


class Placer:
    """Places shared queues, as root."""

    def __init__(
        self, members: Membership, queues: QueueService, wiring: WiringReplication
    ) -> None:
        self.members = members
        self.queues = queues
        self.wiring = wiring
        #: when this server last became root (None: it is not)
        self.root_since: float | None = None
        self.mover = Mover(self)
        #: each durable shared queue's last owner (its address) as this server's store
        #: recorded it before the restart: where a whole-cluster restart places it
        self.recovered_owners: dict[str, str] = {}
        #: the quorum groups it recorded for them (those kept by some primaries only)
        self.recovered_groups: dict[str, tuple[str, ...]] = {}
        #: shrink requests are checked here (``groups.GroupChanges``; the controller's)
        self.group_changes: groups.GroupChanges | None = None
        #: queues whose wait for their last owner is over, and still short of reports
        #: (logged once each)
        self._short: set[str] = set()
        #: queues whose last owner came back without their copy (logged once each)
        self._homeless: set[str] = set()

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

    @staticmethod
    def by_address(live: list[tuple[str, str]]) -> dict[str, str]:
        """The live primaries' spids by address (a restarted server's is new)."""
        return {address: spid for spid, address in live if address}

    def place(self, entry: Entry) -> Entry | AMQPError:
        """An entry about to be ordered: a declare gets its owner, a move request
        becomes the placement it leads to (``moving``), or the reason it cannot."""
        if entry.op == sl.QUEUE_PLACE and dict(entry.props).get("request"):
            return self.mover.request(entry)
        if groups.is_request(entry) and self.group_changes is not None:
            return self.group_changes.request(entry)
        return self.place_declare(entry)

    def recovered(self, entry: Entry) -> Entry:
        """A recovered queue's declare that this root seeds its log with after a whole-
        cluster restart: the queue goes back to the server that owned it before (by
        address: spids change at every start). That server's copy holds everything
        it confirmed; this root's may not (it may have been the replica that lagged
        behind, the majority being the others). That server not live yet, the
        queue waits for it (no owner, its address as home): ``check`` places it
        there once it is, or on the most complete copy at hand after the cluster
        file's ``recovery_wait`` (``_recover_elsewhere``)."""
        if entry.op != sl.QUEUE_DECLARE:
            return entry
        group = self.recovered_groups.get(entry.name)
        if group is not None:
            entry = replace(entry, props=sl.freeze(dict(entry.props) | {"group": group}))
        address = self.recovered_owners.get(entry.name)
        if not address or address == self.members.address:
            return replace(entry, spid=self.members.spid)  # its own copy is the owner's
        by_address = self.by_address(self.primaries())
        if address in by_address and not self._kind(entry)[0].replicated_kind:
            return replace(entry, spid=by_address[address])
        # a replicated queue waits for that server's status to show it came back with
        # its copy (``check``): one at that address with a new disk has none
        log.warning("queue=%s waits for its last owner at %s", entry.name, address)
        return replace(entry, props=sl.freeze(dict(entry.props) | {"home": address}))

    def _kind(self, entry: Entry) -> tuple[type[SharedQueue], dict[str, object]]:
        """A declare's queue kind (the cluster's default for one that names none), and
        its arguments."""
        props = dict(entry.props)
        arguments = dict(props.get("arguments") or ())
        durable = bool(props.get("durable"))
        return KINDS[kind_of(durable, arguments, self.queues.default_queue_type)], arguments

    def place_declare(self, entry: Entry) -> Entry:
        """A shared queue's declare, about to be ordered: it gets its owner. One placed
        already keeps it (a redeclare: the placement entries decide); so does a
        declare that names one (recovered wiring)."""
        if entry.op != sl.QUEUE_DECLARE or rep.placed_by(entry):
            return entry
        vhost = self.queues.vhost()
        if getattr(vhost.queues.get(entry.name) if vhost is not None else None, "epoch", 0):
            return entry
        kind, arguments = self._kind(entry)
        live = self.primaries()
        if kind.replicated_kind:
            live = [(spid, a) for spid, a in live if not self.queues.is_fenced(spid)]
        spids = [spid for spid, _address in live]
        if not spids:
            return entry  # no primary is live: the declare is refused by the root's checks
        placed = self.queues.placed_queues()
        owned = Counter(q.owner for q in placed if q.owner is not None)
        locator = locator_of(arguments, self.members.config.queue_leader_locator)
        owner = choose_owner(locator, entry.origin, spids, owned)
        address = dict(live).get(owner, "")
        held = Counter(a for q in placed if q.group is not None for a in q.group)
        known = self.members.known_primaries(self.members.clock())
        addresses = [a for _spid, a in live if a]
        hosts = self._hosts()
        group = (
            group_of(kind.kind, arguments, address, addresses, known, held, hosts)
            if address
            else None
        )
        log.info(
            "queue=%s (%s) placed on owner=%s%s",
            entry.name,
            kind.kind,
            owner,
            f", group {', '.join(group)}" if group is not None else "",
        )
        if group is None:
            return replace(entry, spid=owner)
        return replace(entry, spid=owner, props=sl.freeze(dict(entry.props) | {"group": group}))

    def _hosts(self) -> dict[str, str]:
        """Each live worker's host by its address, in a cluster of hosts (else empty:
        every server is a host of its own)."""
        group = self.members.hostgroup
        if group is None:
            return {}
        hosts = {self.members.address: group.host_id}
        for peer in self.members.peers.values():
            there = peer_host(peer)
            if there and peer.address:
                hosts[peer.address] = there
        return hosts

    def root_changed(self, is_root: bool) -> None:
        self.root_since = self.members.clock() if is_root else None

    def check(self, lost: str | None = None) -> None:
        """Order what owners coming and going change (root only); ``lost``: a peer
        membership just found inactive."""
        if self.root_since is None or not self.members.decision.is_root:
            return
        self.queues.placements_changed()  # a fenced owner's queues deleted meanwhile
        settled = self.members.clock() - self.root_since >= self.members.config.heartbeat_timeout
        live = self.primaries()
        live_spids = [spid for spid, _a in live]
        now = self.members.clock()
        # heard, then silent past the timeout: lost whether or not this root is settled
        silent = {
            spid
            for spid, peer in self.members.peers.items()
            if peer.gone
            or (peer.status is not None and not self.members.standing.active(peer, now))
        }
        by_address = self.by_address(live)
        failing: dict[str, list[SharedQueue]] = {}
        for queue in self.queues.placed_queues():
            owner = queue.owner
            gone = owner is not None and (
                owner == lost or owner in silent or (settled and owner not in live_spids)
            )
            if owner is None and queue.home in by_address:  # the owner it waits for is back
                self._home_again(queue, by_address[queue.home], live_spids)
            elif queue.replicated_kind:
                if owner is not None and (gone or self.queues.is_fenced(owner)):
                    failing.setdefault(owner, []).append(queue)
                elif owner is None and self._waited(queue):
                    if queue.home:
                        self._recover_elsewhere(queue, live_spids)
                    else:
                        self._place_anywhere(queue, live_spids)
            elif gone:
                self._lost(queue, owner)  # type: ignore[arg-type]
        for owner, queues in failing.items():
            self._fail_over(owner, queues, live_spids)
        self.mover.check()

    def _fail_over(self, owner: str, queues: list[SharedQueue], live: list[str]) -> None:
        """The replicated queues of a lost (or fenced) owner: fence it first, then,
        once enough primaries have reported their copies under the fence, give each
        queue to the furthest copy."""
        if owner == self.members.spid:
            return  # a root does not fail itself over (it steps down first)
        alone = [q for q in queues if q.group is not None and len(q.group) <= 1]
        for queue in alone:
            self._unavailable(queue, owner)
        queues = [q for q in queues if q not in alone]
        if not queues:
            return
        if not self.queues.is_fenced(owner):
            log.warning("owner %s of %d replicated queues lost: fencing it", owner, len(queues))
            self.wiring.fence(owner)
            return
        reports = self._reports(owner, live)
        known = self.members.known_primaries(self.members.clock())
        addresses = dict(self.primaries())
        for queue in queues:
            copies, needed = reports, known - known // 2
            if queue.group is not None:
                copies = {s: r for s, r in reports.items() if addresses.get(s) in queue.group}
                needed = len(queue.group) - len(queue.group) // 2
            if len(copies) < needed:
                continue  # more copies must be heard from: one may be the only whole one
            heir = self._heir(queue.name, copies, live)
            if heir is None:
                continue
            log.warning(
                "queue=%s fails over from %s to %s (epoch %d)",
                queue.name,
                owner,
                heir,
                queue.epoch + 1,
            )
            self.order_place(queue.name, heir, queue.epoch + 1, None)

    def _reports(self, owner: str, live: list[str]) -> dict[str, dict[str, list]]:
        """The live primaries (this root among them) that applied the fence of
        ``owner``: their copies of its queues, by spid."""
        reports: dict[str, dict[str, list]] = {}
        mine = self.queues.copies.fenced_report({owner})
        if owner in mine:
            reports[self.members.spid] = mine[owner]
        for spid in live:
            peer = self.members.peers.get(spid)
            status = peer.status if peer is not None else None
            if spid != owner and status is not None and owner in status.fenced:
                reports[spid] = status.fenced[owner]
        return reports

    def _heir(self, name: str, reports: dict[str, dict[str, list]], live: list[str]) -> str | None:
        """The reporter with the furthest copy of ``name``: a synced one first, then
        the furthest along the old owner's stream, then the earliest primary. A
        fenced server is a sound replica of the others, but one whose own failover
        is under way cannot own yet (its stream is fenced): if the furthest copy is
        there, the queue waits for that failover (None). None holds a copy: the
        earliest reporter takes the queue, empty."""
        order = {spid: i for i, spid in enumerate(live)}
        candidates = [
            (bool(copies[name][0]), int(copies[name][1]), -order.get(spid, len(order)), spid)
            for spid, copies in reports.items()
            if name in copies
        ]
        if candidates:
            best = max(candidates)
            if self.queues.is_fenced(best[3]):
                log.info(
                    "queue=%s waits for the failover of %s, which holds its copy", name, best[3]
                )
                return None
            return best[3]
        heirs = [spid for spid in live if spid in reports and not self.queues.is_fenced(spid)]
        if heirs:
            log.error("queue=%s: no copy of it survived its owner: it starts empty", name)
            return heirs[0]
        return None

    def _home_again(self, queue: SharedQueue, spid: str, live: list[str]) -> None:
        """The server a queue waits for answers at its address again (``spid`` now): a
        classic queue is its again. A replicated one is, once its status shows it
        came back with the queue's copy; one that came back without (a new disk:
        giving it the queue would reset every copy to its empty one) does not get
        it: the queue goes to the most complete copy at hand (``_recover_elsewhere``)."""
        if not queue.replicated_kind:
            self.order_place(queue.name, spid, queue.epoch + 1, None)
            return
        top = self._recovered_copy(spid, queue.name)
        if top is None:
            return  # not reported yet: its next status says
        if top >= 0:
            self.order_place(queue.name, spid, queue.epoch + 1, None)
            return
        if queue.name not in self._homeless:
            self._homeless.add(queue.name)
            log.error(
                "queue=%s: the server at %s, its last owner, came back without its copy (a "
                "new disk?): the queue goes to the most complete copy that came back",
                queue.name,
                queue.home,
            )
        self._recover_elsewhere(queue, live, "came back without its copy")

    def _recovered_copy(self, spid: str, name: str) -> int | None:
        """What server ``spid`` reports of its recovered copy of queue ``name`` (this
        server's from its plane, a peer's from its last status): the highest message
        id, -1 for none, None while it has not said."""
        if spid == self.members.spid:
            return self.queues.recovered_report().get(name)
        peer = self.members.peers.get(spid)
        status = peer.status if peer is not None else None
        return status.recovered.get(name) if status is not None else None

    def _holds_state(self, spid: str) -> bool:
        """Server ``spid`` started from a store that held the cluster's wiring (not a
        new, empty disk): this server's own flag, a peer's from its last status."""
        if spid == self.members.spid:
            return bool(self.members.holds_state)
        peer = self.members.peers.get(spid)
        return bool(peer is not None and peer.status is not None and peer.status.holds_state)

    def _waited(self, queue: SharedQueue) -> bool:
        """An unowned replicated queue waited long enough for the owner it waits for
        (a whole-cluster restart's: ``recovered``), or waits for none."""
        if not queue.home:
            return True
        assert self.root_since is not None
        return self.members.clock() - self.root_since >= self.members.config.recovery_wait

    def _recover_elsewhere(
        self, queue: SharedQueue, live: list[str], why: str | None = None
    ) -> None:
        """A replicated queue whose last owner did not come back after a whole-cluster
        restart: it goes to the live primary whose recovered copy is the most
        complete, its highest message id (ids grow along the queue's history, and
        each copy holds a prefix of it: the highest holds every message a lower one
        holds, or applied its settlement). A message confirmed by the lost owner is
        on a majority with it, so once a majority of the known primaries other than
        it has reported, one report holds it; until then the queue waits. Neither the
        last owner back on a new disk nor any server on a new disk is such a report
        (their -1 says nothing of what they held), except in a group of one, which
        has no other copy. ``why``: how its last owner failed it (default: it did
        not come back in time)."""
        name = queue.name
        if why is None:
            why = f"did not come back within {self.members.config.recovery_wait:.0f}s"
        reports: dict[str, int] = {}  # -1: that server holds no copy of it
        addresses = dict(self.primaries())
        addresses.setdefault(self.members.spid, self.members.address)
        alone = queue.group is not None and len(queue.group) <= 1
        for spid in {self.members.spid, *live}:
            if queue.group is not None and addresses.get(spid) not in queue.group:
                continue  # not of its group: it never kept a copy
            if addresses.get(spid) == queue.home and not alone:
                # the last owner back without its copy: the majority that confirmed
                # counted it, so its empty report must not stand for one of the others
                # (a group of one has no others: its copy is gone with the disk)
                continue
            top = self._recovered_copy(spid, name)
            if top is not None and (top >= 0 or alone or self._holds_state(spid)):
                # (a server on a new disk recovered nothing: its -1 says nothing of
                # what it held, so it is no report either)
                reports[spid] = top
        known = self.members.known_primaries(self.members.clock())
        if queue.group is not None:
            known = len(queue.group)
        order = {spid: i for i, spid in enumerate(live)}
        heirs = [
            (top, -order.get(spid, len(order)), spid)
            for spid, top in reports.items()
            if not self.queues.is_fenced(spid)
        ]
        if len(reports) < known - known // 2 or not heirs:
            if name not in self._short:
                self._short.add(name)
                log.error(
                    "queue=%s: its last owner at %s %s, and only %d of the %d primaries "
                    "needed reported their copies: it waits for them",
                    name,
                    queue.home,
                    why,
                    len(reports),
                    known - known // 2,
                )
            return
        self._short.discard(name)
        top, _order, heir = max(heirs)
        log.error(
            "queue=%s: its last owner at %s %s: it goes to %s, whose recovered copy is "
            "the most complete (highest message id %d; copies: %s)",
            name,
            queue.home,
            why,
            heir,
            top,
            ", ".join(f"{spid}={mid}" for spid, mid in sorted(reports.items())),
        )
        self.order_place(name, heir, queue.epoch + 1, None)

    def _place_anywhere(self, queue: SharedQueue, live: list[str]) -> None:
        """A replicated queue with no owner (none was live at its declare): the earliest
        live primary that is not fenced takes it."""
        heirs = [spid for spid in live if not self.queues.is_fenced(spid)]
        if heirs:
            self.order_place(queue.name, heirs[0], queue.epoch + 1, None)

    def _lost(self, queue: SharedQueue, owner: str) -> None:
        name = queue.name
        if not queue.durable:
            log.warning("owner %s of transient queue=%s lost: the queue goes with it", owner, name)
            self.wiring.order_delete(queue)
            return
        self._unavailable(queue, owner)

    def _unavailable(self, queue: SharedQueue, owner: str) -> None:
        """A durable queue kept on its lost owner alone (classic, or a quorum group of
        one) waits for it, by address: the same server back, under any spid."""
        peer = self.members.peers.get(owner)
        home = peer.address if peer is not None and peer.address else owner
        log.warning(
            "owner %s of durable queue=%s (%s) lost: unavailable until it returns",
            owner,
            queue.name,
            "its own copy alone" if queue.replicated_kind else "classic",
        )
        self.order_place(queue.name, None, queue.epoch + 1, home)

    def order_place(self, name: str, owner: str | None, epoch: int, home: str | None) -> None:
        entry = rep.place_entry(self.members.config.vhost, name, owner, epoch, home)
        self.wiring.order(entry)
