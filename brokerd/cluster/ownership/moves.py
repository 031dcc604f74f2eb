"""Operators' queue moves and rebalances, as the root decides them (issue 23).

A move is asked of the root by any server (``brokerd ctl queue move``, the
console, a rebalance) as a ``queue.place`` request naming the target. The
root checks it against what it knows and orders a placement that keeps the
owner and names the target; each server then plays its part of the hand-over
(``queues.handover``). The owner, once the target holds the whole queue, asks
for the placement on the target, which the root checks and orders too. A
move that does not end within ``MOVE_TIMEOUT``, or whose target is lost, is
called off: the root places the queue on its owner again, and everything
kept for it goes there. A lost owner's queue fails over as any other
(``placing``), which ends its move as well.

Only replicated and quorum queues move: a classic queue lives on its owner
alone, with no copy to move to (RabbitMQ cannot transfer a classic queue's
leadership either); a quorum queue whose group leaves some primaries out
moves within its group, as RabbitMQ's ``transfer_leadership`` does.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.cluster.hostgroup import peer_host
from brokerd.cluster.wiring import entries as rep
from brokerd.model.errors import NOT_FOUND, PRECONDITION_FAILED, AMQPError

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.cluster.queues.service import QueueService
    from brokerd.cluster.queues.shared import SharedQueue
    from brokerd.cluster.wiring.replication import WiringReplication
    from brokerd.cluster.wiring.statelog import Entry

log = logging.getLogger("brokerd.cluster.ownership.moves")

#: what a move request's requester hears from the root: its refusal, or None
Done = Callable[[AMQPError | None, Any], None]

#: a hand-over must end within this (its publishes wait meanwhile), in seconds
MOVE_TIMEOUT = 5.0


class MoveRefused(AMQPError):
    """A move the rules refuse; the text says why."""

    def __init__(self, text: str, code: int = PRECONDITION_FAILED) -> None:
        super().__init__(code, text)


def check_move(
    queue: SharedQueue | None,
    name: str,
    to: str,
    live: Sequence[str],
    stopping: Collection[str] = (),
    addresses: Mapping[str, str] | None = None,
) -> SharedQueue:
    """The queue ``name`` may move to primary ``to`` (``live``: the live primaries
    that are not fenced; ``stopping``: those on their way out, which may hand
    queues over and take none; ``addresses``: the live primaries' addresses, by
    spid, which a quorum queue's group names); raises ``MoveRefused`` with the
    reason otherwise."""
    if queue is None:
        raise MoveRefused(f"no shared queue '{name}'", NOT_FOUND)
    if not queue.replicated_kind:
        raise MoveRefused(
            f"queue '{name}' is a classic queue: it lives on its owner alone, "
            "with no copy to move to"
        )
    if queue.owner is None:
        raise MoveRefused(f"queue '{name}' has no owner now (a failover is under way)")
    if queue.moving is not None:
        raise MoveRefused(f"queue '{name}' is moving to {queue.moving} already")
    if to == queue.owner:
        raise MoveRefused(f"queue '{name}' is owned by {to} already")
    if to not in live:
        raise MoveRefused(f"{to} is not a live primary: queue '{name}' cannot move there")
    if to in stopping:
        raise MoveRefused(f"{to} is stopping: queue '{name}' cannot move there")
    if queue.group is not None and (addresses or {}).get(to) not in queue.group:
        raise MoveRefused(
            f"queue '{name}' keeps its copies on {', '.join(queue.group)} (its quorum "
            f"group): it can move to one of them only"
        )
    if queue.owner not in live:
        raise MoveRefused(
            f"queue '{name}': its owner {queue.owner} is not live (it fails over instead)"
        )
    return queue


def plan_rebalance(
    owners: Mapping[str, str],
    movable: set[str],
    primaries: Sequence[str],
    within: Mapping[str, Collection[str]] | None = None,
) -> list[tuple[str, str, str]]:
    """Moves, as (queue, from, to), that leave no primary owning more than its share:
    every owned queue over the primaries, rounded up (``rabbitmq-queues
    rebalance``). ``owners``: every shared queue's owner (classic ones count, but
    only ``movable`` queues move); queues go from the primaries owning most to
    those owning fewest, in name order, so a plan is the same wherever made.
    ``within``: the primaries a queue may go to, for those kept by some only (a
    quorum queue's group)."""
    within = within or {}
    if not primaries:
        return []
    owned = Counter(owner for owner in owners.values() if owner in primaries)
    share = -(-sum(owned.values()) // len(primaries))
    moves: list[tuple[str, str, str]] = []
    for name in sorted(owners):
        owner = owners[name]
        if name not in movable or owner not in primaries or owned[owner] <= share:
            continue
        allowed = within.get(name)
        candidates = [p for p in primaries if allowed is None or p in allowed]
        if not candidates:
            continue
        to = min(candidates, key=lambda spid: (owned[spid], primaries.index(spid)))
        if owned[to] + 1 > share or to == owner:
            continue
        owned[owner] -= 1
        owned[to] += 1
        moves.append((name, owner, to))
    return moves


def plan_evacuation(
    names: Sequence[str],
    owners: Mapping[str, str],
    targets: Sequence[str],
    within: Mapping[str, Collection[str]] | None = None,
) -> list[tuple[str, str]]:
    """Where each of a stopping server's queues ``names`` goes, as (queue, to): to the
    target owning fewest at the time (``owners``: every shared queue's owner; ties
    go to the most senior, ``targets`` being in seniority order), in name order;
    ``within``: as for ``plan_rebalance`` (a queue with no target there stays)."""
    if not targets:
        return []
    within = within or {}
    owned = Counter(owner for owner in owners.values() if owner in targets)
    moves = []
    for name in sorted(names):
        allowed = within.get(name)
        candidates = [t for t in targets if allowed is None or t in allowed]
        if not candidates:
            continue
        to = min(candidates, key=lambda spid: (owned[spid], targets.index(spid)))
        owned[to] += 1
        moves.append((name, to))
    return moves


class Placing(Protocol):
    """What moves ask of the root's placer (``placing.Placer``): where queues and
    primaries are, and how a placement is ordered."""

    members: Membership
    queues: QueueService
    wiring: WiringReplication
    mover: Mover

    def primaries(self) -> list[tuple[str, str]]: ...

    def order_place(self, name: str, owner: str | None, epoch: int, home: str | None) -> None: ...


class Mover:
    """The root's checks of move requests, and the moves it calls off."""

    def __init__(self, placer: Placing) -> None:
        self.placer = placer

    def live(self) -> list[str]:
        queues = self.placer.queues
        return [spid for spid, _a in self.placer.primaries() if not queues.is_fenced(spid)]

    def stopping(self) -> set[str]:
        """The primaries on their way out (a planned stop, their statuses say): they
        hand their queues over and take none."""
        members = self.placer.members
        out = {p.spid for p in members.peers.values() if p.status and p.status.stopping}
        if members.standing.stopping:
            out.add(members.spid)
        return out

    def targets(self) -> list[str]:
        """The live primaries a queue may move to, in seniority order."""
        stopping = self.stopping()
        return [spid for spid in self.live() if spid not in stopping]

    def request(self, entry: Entry) -> Entry | AMQPError:
        """A move request about to be ordered: the placement it leads to, or why not."""
        queues = self.placer.queues
        props = dict(entry.props)
        queue = queues.shared_queue(entry.name)
        if props.get("request") == rep.MOVED:
            if (
                queue is None
                or queue.moving != entry.spid
                or queue.owner != entry.origin
                or int(props.get("epoch", 0)) != queue.epoch
            ):
                return MoveRefused(f"queue '{entry.name}': that move is over already")
            return rep.place_entry(entry.vhost, entry.name, entry.spid, queue.epoch + 1, None)
        try:
            check_move(
                queue,
                entry.name,
                entry.spid,
                self.live(),
                self.stopping(),
                dict(self.placer.primaries()),
            )
        except MoveRefused as exc:
            return exc
        assert queue is not None
        log.warning("queue=%s moves from %s to %s", entry.name, queue.owner, entry.spid)
        return rep.place_entry(
            entry.vhost, entry.name, queue.owner, queue.epoch + 1, None, entry.spid
        )

    def check(self) -> None:
        """Root: call off the moves that took too long or lost their target."""
        placer = self.placer
        live = self.live()
        now = placer.members.clock()
        for queue in placer.queues.placed_queues():
            target = queue.moving
            if target is None or queue.owner not in live:
                continue  # a lost owner's queue fails over instead (``placing``)
            lost = target not in live
            if not lost and now - queue.move_since < MOVE_TIMEOUT:
                continue
            log.warning(
                "queue=%s: its move to %s is called off (%s): it stays on %s",
                queue.name,
                target,
                "the target is not live" if lost else f"not over in {MOVE_TIMEOUT:.0f}s",
                queue.owner,
            )
            placer.order_place(queue.name, queue.owner, queue.epoch + 1, None)


class QueueMoves:
    """What any server asks of the root to move queues: an operator's move, a
    rebalance, and an owner's hand-over done (``queues.handover``)."""

    def __init__(self, placer: Placing) -> None:
        self.placer = placer

    def resolve(self, to: str, name: str = "") -> str:
        """A live primary's spid from its spid or its address (host:port); in a cluster
        of hosts also from a host's address (``queue move Q HOST:PORT``): that host's
        worker that keeps a copy of queue ``name``, else the one owning fewest."""
        live = self.placer.primaries()
        for spid, address in live:
            if to in (spid, address):
                return spid
        workers = self._on_host(to, [spid for spid, _address in live])
        if workers:
            queue = self.placer.queues.shared_queue(name)
            group = set(queue.group or ()) if queue is not None else set()
            addresses = dict(live)
            owned = Counter(q.owner for q in self.placer.queues.placed_queues())
            return min(workers, key=lambda s: (addresses.get(s) not in group, owned[s], s))
        return to  # not live: the checks say so

    def _on_host(self, address: str, live: list[str]) -> list[str]:
        """The live workers of the host known by ``address`` (its client address, or a
        known-host name that reached one of its workers); [] outside a cluster of hosts."""
        members = self.placer.members
        group = members.hostgroup
        if group is None:
            return []
        host = None
        if address in (group.host_address, *members.own_addresses):
            host = group.host_id
        for peer in members.peers.values():
            status = peer.status
            if status is not None and address in (status.host_address, *peer.aliases):
                host = status.host or host
        if host is None:
            return []
        peers = members.peers
        return [
            spid
            for spid in live
            if (group.host_id if spid == members.spid else peer_host(peers[spid])) == host
        ]

    def move(self, name: str, to: str, done: Done | None = None) -> dict[str, str]:
        """Ask for queue ``name`` to move to primary ``to`` (a spid or an address).
        Refused at once (``MoveRefused``) on what this server knows; the root checks
        again and ``done`` gets its refusal or its go-ahead."""
        placer = self.placer
        queues = placer.queues
        target = self.resolve(to, name)
        mover = placer.mover
        queue = check_move(
            queues.shared_queue(name),
            name,
            target,
            mover.live(),
            mover.stopping(),
            dict(placer.primaries()),
        )
        owner = queue.owner or ""
        placer.wiring.request(
            rep.move_request(placer.members.config.vhost, name, target, placer.members.spid),
            done,
        )
        return {"queue": name, "from": owner, "to": target, "state": "requested"}

    def rebalance(self) -> list[dict[str, str]]:
        """Ask for the moves that spread the queues' owners evenly over the live
        primaries (``plan_rebalance``); queues moving already stay out of it."""
        placer = self.placer
        queues = [q for q in placer.queues.placed_queues() if q.owner is not None]
        owners = {q.name: q.owner for q in queues if q.owner is not None}
        movable = {q.name for q in queues if q.replicated_kind and q.moving is None}
        moves = []
        within = self.groups(queues)
        for name, owner, to in plan_rebalance(owners, movable, placer.mover.targets(), within):
            try:
                moves.append(self.move(name, to, _logged(name, to)))
            except MoveRefused as exc:
                log.warning("rebalance: queue=%s stays on %s: %s", name, owner, exc.text)
        return moves

    def evacuate(self, done: Callable[[str], None]) -> list[dict[str, str]]:
        """A planned stop: ask for every replicated queue this server owns to move to
        the other primaries, spread by what they own (``plan_evacuation``), so that
        it moves (a pause of a round trip) instead of failing over once this server
        is gone (redeliveries, and the outage until the failover). ``done(name)``:
        the root refused that move (the queue then fails over as before)."""
        placer = self.placer
        queues = placer.queues
        own = placer.members.spid
        mine = [q.name for q in queues.owned_replicated() if q.moving is None]
        owners = {q.name: q.owner for q in queues.placed_queues() if q.owner is not None}
        targets = [spid for spid in placer.mover.targets() if spid != own]
        moves = []
        within = self.groups(queues.owned_replicated())
        for name, to in plan_evacuation(mine, owners, targets, within):

            def refused(error: AMQPError | None, _result: object, name: str = name) -> None:
                if error is not None:
                    log.warning("stopping: queue=%s stays here: %s", name, error.text)
                    done(name)

            try:
                moves.append(self.move(name, to, refused))
            except MoveRefused as exc:
                log.warning("stopping: queue=%s stays here: %s", name, exc.text)
        return moves

    def groups(self, queues: Sequence[SharedQueue]) -> dict[str, set[str]]:
        """The live primaries each queue kept by some only (a quorum queue's group) may
        move to."""
        live = self.placer.primaries()
        return {
            q.name: {spid for spid, address in live if address in q.group}
            for q in queues
            if q.group is not None
        }

    def handed(self, queue: SharedQueue, to: str) -> None:
        """This server, the owner, handed ``queue`` over: the root places it on ``to``."""
        placer = self.placer
        entry = rep.moved_request(
            placer.members.config.vhost, queue.name, to, queue.epoch, placer.members.spid
        )
        placer.wiring.request(entry, _logged(queue.name, to))


def _logged(name: str, to: str) -> Done:
    def done(error: AMQPError | None, _result: object) -> None:
        if error is not None:
            log.warning("queue=%s: the move to %s was refused: %s", name, to, error.text)

    return done
