"""A quorum queue's group changes on its owner (``brokerd ctl queues grow``/``shrink``,
the root's target size): ``Regroups``, mixed into ``Stream``.

A member taken in gets the queue's reset and snapshot and counts for the group's
floor only once an ack of an event after that snapshot proves it holds the queue
(``growing``); the owner sends such an event itself when the snapshot is in,
since the publishers may all be waiting for exactly that. What waited on the old
group (confirms, held deliveries) waits on the new one when no other queue of
this server has the old group: every member of the new group that counts holds
all the queue had (a member of the old one, or a grown one by its snapshot), and
a member of the old group that died must not hold them for ever.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.replication.replicas import Gate, ReplicaLink

if TYPE_CHECKING:
    from brokerd.cluster.plane.transport import Transport
    from brokerd.cluster.queues.replication.store import ReplicatingStore
    from brokerd.model.completion import Done

log = logging.getLogger("brokerd.cluster.queues.replication.stream")

#: whose acks a floor counts: the addresses of a quorum queue's group, or None for
#: every primary (a replicated queue, a quorum queue whose group is every primary)
Group = frozenset[str] | None


class Regroups:
    """Growing and shrinking the groups of the quorum queues this server owns."""

    replicas: dict[str, ReplicaLink]
    transport: Transport
    groups: dict[str, frozenset[str]]
    growing: dict[str, set[str]]
    _confirms: dict[Group, deque[tuple[int, Done]]]
    _gates: dict[Group, deque[Gate]]
    _gate: dict[Group, Gate]
    _advance: Callable[[], None]
    _schedule_sync: Callable[[], None]

    def regroup(self, name: str, group: frozenset[str], store: ReplicatingStore | None) -> None:
        """Queue ``name``'s group is ``group`` now: the members it took in sync first
        (``grow``), and its floor is the new group's from now on."""
        old = self.groups.get(name)
        self.groups[name] = group
        if store is not None and old is not None:
            for address in sorted(group - old):
                self.grow(name, address, store)
        if old is not None and old != group and old not in self.groups.values():
            self._carry(old, group)
        self._advance()

    def grow(self, name: str, address: str, store: ReplicatingStore) -> None:
        """Queue ``name``'s group took in ``address``: that replica gets the queue's
        reset and snapshot (``sync_step`` then sends an event after it), and
        counts for the group's floor only once it acks that, the floor needing a
        majority of the whole new group meanwhile, from the members that count."""
        self.growing.setdefault(name, set()).add(address)
        replica = next((r for r in self.replicas.values() if r.address == address), None)
        if replica is None:
            return  # not linked now: it gets the queue's snapshot when it joins (``add``)
        replica.queues.pop(name, None)
        self.transport.repl_batch(replica.out).replicate(0, rec.R_RESET, name, 0)
        replica.syncs.append((name, deque(store.entries)))
        self._schedule_sync()

    def _holds_grown(self, replica: ReplicaLink) -> None:
        for name, waiting in list(self.growing.items()):
            sent = replica.queues.get(name)
            if replica.address in waiting and sent is not None and replica.acked > sent:
                waiting.discard(replica.address)
                log.warning("replica %s holds %s: it counts for its group", replica.spid, name)
                if not waiting:
                    del self.growing[name]

    def _carry(self, old: frozenset[str], new: frozenset[str]) -> None:
        """What waits on ``old``'s floor (no queue here has that group now) waits on
        ``new``'s, in the order of the events waited for."""
        confirms = self._confirms.pop(old, None)
        if confirms:
            there = self._confirms.get(new, ())
            self._confirms[new] = deque(heapq.merge(there, confirms, key=lambda c: c[0]))
        gates = self._gates.pop(old, None)
        self._gate.pop(old, None)  # the next delivery makes a gate of the new group
        if gates:
            there_gates = self._gates.get(new, ())
            self._gates[new] = deque(heapq.merge(there_gates, gates, key=lambda g: g.seq))
