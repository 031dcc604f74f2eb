"""Which events of an owner's stream are confirmed: the quorum floor (seed 001's
"completion after replication"). Pure: no I/O, no clock; ``stream.Stream`` keeps
one floor per group and asks this module whenever a replica acks.

An event is confirmed once the owner and ``need`` replicas hold it and every event
before it: ``need`` is half the known primaries (of a quorum queue's group, for a
queue whose group leaves some out), so the owner and the replicas counted make a
majority, reachable or not. A replica counts by the last event it acked, with
these rules for one that joined late (a restart, a gap) and takes a snapshot of
the queues before its live stream:

- once any counted replica's snapshot has been sent, only *whole* replicas count
  (snapshot in, and a live event after it acked): one still syncing holds what
  came after its join, not what came before, and a failover prefers a whole copy;
- right after the owner took the queues on, every replica is syncing and none is
  whole: those that joined no later than the floor count by their live stream,
  so publishers go on at once (what came before is the owner's alone anyway);
- the floor stays where it is while the stream is fenced (its replicas ack it no
  more, and its queues fail over).

``tests/unit/test_quorum_floor.py`` checks these as hypothesis properties, and
``tests/unit/test_election_copy.py`` that the election then picks a copy holding
every confirmed event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Place:
    """One replica's place in the stream, as the floor weighs it."""

    #: the last event it acked
    acked: int
    #: the event it joined at (what came before reaches it with its snapshot)
    joined: int
    #: its snapshot was sent (it is whole or taking it)
    synced: bool
    #: its snapshot is in, and a live event after it acked
    whole: bool


def needed(members: int) -> int:
    """Replica acks an event needs besides the owner's copy: with the owner, a
    majority of ``members`` primaries (the known ones, or a quorum queue's group)."""
    return members // 2


def floor(replicas: Iterable[Place], need: int, top: int, previous: int, fenced: bool) -> int:
    """The highest event held, with every event before it, by ``need`` counted
    replicas (see the module docstring); ``top``: the stream's last event (the floor
    when no replica is needed), ``previous``: the floor so far."""
    if need <= 0:
        return top
    if fenced:
        return previous
    places = list(replicas)
    if any(p.synced for p in places):
        counted = [p.acked for p in places if p.whole]
    else:
        counted = [p.acked for p in places if p.joined <= previous]
    counted.sort(reverse=True)
    return counted[need - 1] if len(counted) >= need else previous
