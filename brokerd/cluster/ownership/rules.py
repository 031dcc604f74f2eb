"""Where each shared queue lives: its owner and its replicas (seed 001, "moving
queue ownership"; issue 23). Pure decisions, no I/O.

The root takes these decisions and orders them in the state log, so every
server applies the same placements in the same order; the root carries no
queue's traffic unless it owns the queue. This module is the rule book: the
table of placements and what changes it (``placing.Placer`` applies the
owner rules as root, ``moving`` the moves and rebalances, ``group_of`` a
quorum queue's group; ``PlacementTable`` is the model the hypothesis state
machine checks these rules against).

- **Placement on declare** follows RabbitMQ's ``x-queue-leader-locator``:
  ``client-local`` puts the owner on the declaring server when it is a
  primary; ``balanced`` on the primary that owns the fewest queues. A declare
  naming neither (or a value we do not know) gets the cluster file's
  ``queue_leader_locator``, ``client-local`` by default. Ties go to the
  earlier primary in the order given (seniority).
- **Replicas** by type: a ``classic`` queue has none (lost with its owner if
  transient, unavailable until the owner returns if durable, as RabbitMQ's
  classic queue on a dead node); a ``quorum`` queue has its group
  (``x-quorum-initial-group-size``, default 3, at most the primaries) less its
  owner; a ``replicated`` one (a durable shared queue declared without a
  type) has every other primary. Replicas go to the primaries holding the
  fewest.
- **Failover per queue**: when a server is lost, only the queues it owned
  change owner, each to its live replica furthest along the queue's stream
  (``positions``), then the earliest. Its epoch grows: a fencing token that
  tells a returning old owner its claim is stale. The lost server stays in the
  replica sets and catches up when it returns.
- **Moves** go to a replica only (it holds the queue's messages);
  ``rebalance`` moves owners, replicas permitting, until no primary owns more
  than its share, as ``rabbitmq-queues rebalance`` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from brokerd.cluster.queues.kinds import CLASSIC, QUORUM, REPLICATED, kind_of

__all__ = ["CLASSIC", "QUORUM", "REPLICATED", "kind_of"]  # the names the rules decide on

CLIENT_LOCAL = "client-local"
BALANCED = "balanced"
#: x-quorum-initial-group-size's default, as RabbitMQ's
QUORUM_GROUP = 3


def locator_of(arguments: Mapping[str, object], default: str = CLIENT_LOCAL) -> str:
    """Where a declare asks its queue to live: ``x-queue-leader-locator`` (quorum),
    or a classic queue's ``x-queue-master-locator``, whose ``min-masters`` and
    ``random`` both mean the least loaded primary here. A declare that names no
    locator we know gets ``default`` (the cluster file's ``queue_leader_locator``,
    as RabbitMQ's ``queue_leader_locator`` setting covers clients that send none)."""
    for key in ("x-queue-leader-locator", "x-queue-master-locator"):
        value = arguments.get(key)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if value in (BALANCED, "min-masters", "random"):
            return BALANCED
        if value == CLIENT_LOCAL:
            return CLIENT_LOCAL
    return default


class PlacementError(ValueError):
    """A move or declare that the rules refuse; the message says why."""


@dataclass(frozen=True, slots=True)
class Placement:
    """One shared queue's place in the cluster."""

    kind: str
    durable: bool
    #: the server that holds and delivers the queue; None while a durable
    #: classic queue's owner is away (the queue is unavailable)
    owner: str | None
    #: other primaries keeping a copy
    replicas: tuple[str, ...]
    #: grows with every owner change
    epoch: int = 1
    #: the owner it had before it became unavailable: it returns to it
    home: str | None = None


def choose_owner(
    locator: str, declared_on: str, primaries: Sequence[str], owned: Mapping[str, int]
) -> str:
    """The declared queue's owner among ``primaries`` (seniority order)."""
    if not primaries:
        raise PlacementError("no primary to own the queue")
    if locator != BALANCED and declared_on in primaries:
        return declared_on
    return min(primaries, key=lambda spid: (owned.get(spid, 0), primaries.index(spid)))


def group_size(arguments: Mapping[str, object]) -> int:
    """``x-quorum-initial-group-size`` (checked at declare: a positive integer), or
    RabbitMQ's default of 3."""
    size = arguments.get("x-quorum-initial-group-size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    return QUORUM_GROUP


def group_of(
    kind: str,
    arguments: Mapping[str, object],
    owner: str,
    primaries: Sequence[str],
    known: int,
    held: Mapping[str, int],
    hosts: Mapping[str, str] | None = None,
) -> tuple[str, ...] | None:
    """The servers, by address, that keep a new queue's copies: its owner first,
    then the live ``primaries`` (seniority order) in fewest groups (``held``),
    each from the host with fewest of the group's copies so far (``hosts``: a
    worker's host by its address; a server not in it is a host of its own).
    None: every primary keeps one (a replicated queue, or a quorum queue whose
    group is as large as the ``known`` primaries): the group names only what
    leaves some out. RabbitMQ forms a quorum queue's group of up to
    ``x-quorum-initial-group-size`` members from the nodes running at declare;
    so does this, and it keeps them (``rabbitmq-queues grow`` has no
    counterpart yet)."""
    if kind != QUORUM:
        return None
    size = group_size(arguments)
    if size >= known:
        return None
    host = (hosts or {}).get
    pool = sorted(
        (address for address in primaries if address != owner),
        key=lambda address: (held.get(address, 0), primaries.index(address)),
    )
    group = [owner]
    on = Counter([host(owner, owner)])
    while pool and len(group) < size:
        # the host with fewest copies so far first: one that fails takes as few as can be
        pick = min(pool, key=lambda address: on[host(address, address)])
        pool.remove(pick)
        group.append(pick)
        on[host(pick, pick)] += 1
    return tuple(group)


def replica_count(kind: str, group_size: int | None, primaries: int) -> int:
    """How many copies besides the owner's a queue of ``kind`` keeps."""
    if kind == CLASSIC:
        return 0
    if kind == QUORUM:
        return max(0, min(group_size or QUORUM_GROUP, primaries) - 1)
    return max(0, primaries - 1)


class PlacementTable:
    """Every shared queue's placement, as the root decides it."""

    def __init__(self) -> None:
        self.queues: dict[str, Placement] = {}

    def owned(self) -> dict[str, int]:
        """Queues owned per server."""
        counts: dict[str, int] = {}
        for placement in self.queues.values():
            if placement.owner is not None:
                counts[placement.owner] = counts.get(placement.owner, 0) + 1
        return counts

    def replicated(self) -> dict[str, int]:
        """Copies kept per server."""
        counts: dict[str, int] = {}
        for placement in self.queues.values():
            for spid in placement.replicas:
                counts[spid] = counts.get(spid, 0) + 1
        return counts

    def declare(
        self,
        name: str,
        *,
        kind: str,
        durable: bool,
        declared_on: str,
        primaries: Sequence[str],
        locator: str = CLIENT_LOCAL,
        group_size: int | None = None,
    ) -> Placement:
        """Place a new queue (an existing one keeps its place: a redeclare)."""
        existing = self.queues.get(name)
        if existing is not None:
            return existing
        owner = choose_owner(locator, declared_on, primaries, self.owned())
        held = self.replicated()
        others = sorted(
            (spid for spid in primaries if spid != owner),
            key=lambda spid: (held.get(spid, 0), primaries.index(spid)),
        )
        count = replica_count(kind, group_size, len(primaries))
        placement = Placement(kind, durable, owner, tuple(others[:count]))
        self.queues[name] = placement
        return placement

    def delete(self, name: str) -> None:
        self.queues.pop(name, None)

    def move(self, name: str, to: str) -> Placement:
        """Hand a queue's ownership to one of its replicas."""
        placement = self.queues.get(name)
        if placement is None:
            raise PlacementError(f"no shared queue '{name}'")
        if placement.owner == to:
            return placement
        if to not in placement.replicas:
            raise PlacementError(
                f"queue '{name}' has no copy on {to}: it can move to a replica only "
                f"({', '.join(placement.replicas) or 'none: a classic queue stays on its owner'})"
            )
        if placement.owner is None:
            raise PlacementError(f"queue '{name}' is unavailable: its owner is away")
        replicas = tuple(placement.owner if spid == to else spid for spid in placement.replicas)
        moved = replace(placement, owner=to, replicas=replicas, epoch=placement.epoch + 1)
        self.queues[name] = moved
        return moved

    def lost(
        self, spid: str, live: Sequence[str], positions: Mapping[tuple[str, str], int]
    ) -> dict[str, Placement | None]:
        """``spid`` is gone: each queue it owned fails over to its live replica
        furthest along (``positions[(queue, replica)]``), then the earliest in
        ``live``. Returns the changed placements (None: a transient classic
        queue, lost with its owner, is deleted)."""
        changed: dict[str, Placement | None] = {}
        for name, placement in list(self.queues.items()):
            if placement.owner != spid:
                continue
            candidates = [r for r in placement.replicas if r in live and r != spid]
            if candidates:
                heir = max(
                    candidates,
                    key=lambda r: (positions.get((name, r), 0), -live.index(r)),
                )
                replicas = tuple(spid if r == heir else r for r in placement.replicas)
                new: Placement | None = replace(
                    placement, owner=heir, replicas=replicas, epoch=placement.epoch + 1
                )
            elif placement.durable:
                new = replace(placement, owner=None, home=spid, epoch=placement.epoch + 1)
            else:
                new = None
            if new is None:
                del self.queues[name]
            else:
                self.queues[name] = new
            changed[name] = new
        return changed

    def returned(self, spid: str) -> dict[str, Placement]:
        """``spid`` is back: the durable queues that waited for it are its again."""
        changed: dict[str, Placement] = {}
        for name, placement in self.queues.items():
            if placement.owner is None and placement.home == spid:
                changed[name] = replace(placement, owner=spid, home=None, epoch=placement.epoch + 1)
        self.queues.update(changed)
        return changed

    def rebalance(self, primaries: Sequence[str]) -> list[tuple[str, str]]:
        """Move owners, replicas permitting, until no primary owns more than its
        share (the queues over the primaries, rounded up). Returns the moves made."""
        if not primaries:
            return []
        owned = self.owned()
        available = sum(owned.values())
        share = -(-available // len(primaries))
        moves: list[tuple[str, str]] = []
        for name in sorted(self.queues):
            placement = self.queues[name]
            owner = placement.owner
            if owner is None or owned.get(owner, 0) <= share:
                continue
            targets = [r for r in placement.replicas if r in primaries and owned.get(r, 0) < share]
            if not targets:
                continue
            to = min(targets, key=lambda r: (owned.get(r, 0), primaries.index(r)))
            self.move(name, to)
            owned[owner] -= 1
            owned[to] = owned.get(to, 0) + 1
            moves.append((name, to))
        return moves
