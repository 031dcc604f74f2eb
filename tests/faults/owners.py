"""No queue has two owners that both confirm (issue 41), from the servers' own logs.

An owner marks its confirms (``brokerd/cluster/queues/replication/marks.py``:
``confirms queue=Q term=T epoch=N owner=SPID seq=S``, at most every 20 ms per
queue and once more after a burst, on servers started with
``--enable-fault-injection``), naming the placement it owns the queue by (epoch
N of the state log of term T), itself, and the highest event of its
replication stream confirmed so far.
Every server logs with millisecond timestamps from the one clock they share, so
per queue the marks of all servers can be put in one order: a mark of an
earlier (term, epoch) after one of a later is an owner confirming after its
successor began to (epochs alone start again when a whole-cluster restart
seeds the state log anew; its term is a later one), which is what a partition
must never allow (the later owner may not hold what the earlier one confirmed).

Unless the late owner's stream had reached its replicas: each replica logs
``owner SPID fenced: its stream stops at event N here`` when it applies the
fence, and the next owner takes the queue from the most complete of those
copies. A late mark whose ``seq`` is at most the highest such N logged for its
owner by then confirmed only what a replica held before the fence (a resumed
SIGSTOPped owner reading acks its replicas sent before they fenced it): it is
``held``, reported apart and not a failure. Anything beyond N is a confirm the
next owner may not hold."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

MARK = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO (?:worker-\d+ )?brokerd\.cluster\.confirms: "
    r"confirms queue=(\S+) term=(\d+) epoch=(\d+)(?: owner=(\S+) seq=(\d+))?$"
)
FENCE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*owner (\S+) fenced: "
    r"its stream stops at event (\d+) here$"
)


@dataclass(frozen=True)
class Mark:
    at: float
    queue: str
    term: int
    epoch: int
    server: str
    owner: str = "-"
    #: the highest event of the owner's stream confirmed so far (0: not logged)
    seq: int = 0

    @property
    def placement(self) -> tuple[int, int]:
        return (self.term, self.epoch)


@dataclass(frozen=True)
class Overlap:
    """``late`` (an earlier epoch's owner) confirmed after ``early`` (a later one's) had."""

    queue: str
    early: Mark
    late: Mark
    #: the highest fence point of the late owner's stream logged by then (0: none)
    fenced_at: int = 0

    @property
    def held(self) -> bool:
        """The late owner confirmed only events a replica held before its fence."""
        return 0 < self.late.seq <= self.fenced_at

    @property
    def seconds(self) -> float:
        return self.late.at - self.early.at

    def __str__(self) -> str:
        held = (
            f" (event {self.late.seq}, held: its replicas fenced it at {self.fenced_at})"
            if self.held
            else f" (event {self.late.seq}, fenced at {self.fenced_at or 'no logged point'})"
        )
        return (
            f"{self.queue}: term {self.late.term} epoch {self.late.epoch} on "
            f"{self.late.server} confirmed {self.seconds * 1000:.0f} ms after term "
            f"{self.early.term} epoch {self.early.epoch} on {self.early.server} had{held}"
        )


def marks(server: str, log_text: str) -> list[Mark]:
    out = []
    for line in log_text.splitlines():
        match = MARK.match(line)
        if match is not None:
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            owner, seq = match[5] or "-", int(match[6] or 0)
            out.append(Mark(at, match[2], int(match[3]), int(match[4]), server, owner, seq))
    return out


@dataclass(frozen=True)
class Fence:
    """A replica applied the fence of ``owner``'s stream, having applied up to ``seq``."""

    at: float
    owner: str
    seq: int


def fences(log_text: str) -> list[Fence]:
    out = []
    for line in log_text.splitlines():
        if "fenced: its stream stops" in line and (match := FENCE.match(line)) is not None:
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append(Fence(at, match[2], int(match[3])))
    return out


def fenced_at(points: Iterable[Fence], owner: str, by: float) -> int:
    """The highest fence point of ``owner``'s stream logged by time ``by`` (0: none)."""
    return max((f.seq for f in points if f.owner == owner and f.at <= by), default=0)


def overlaps(all_marks: Iterable[Mark], points: Iterable[Fence] = ()) -> list[Overlap]:
    """Per queue, each mark that comes (strictly later) after a mark of a later
    placement; per pair of placements the latest such mark that was ``held`` and
    the latest that was not, with the fence point of its owner's stream
    (``points``) by then."""
    points = list(points)
    found: dict[tuple[str, tuple[int, int], tuple[int, int], bool], Overlap] = {}
    by_queue: dict[str, list[Mark]] = {}
    for mark in all_marks:
        by_queue.setdefault(mark.queue, []).append(mark)
    for queue, queue_marks in by_queue.items():
        first_of: dict[tuple[int, int], Mark] = {}
        for mark in sorted(queue_marks, key=lambda m: (m.at, m.placement)):
            first_of.setdefault(mark.placement, mark)
            later = [m for p, m in first_of.items() if p > mark.placement and m.at < mark.at]
            if later:
                early = min(later, key=lambda m: m.at)
                overlap = Overlap(queue, early, mark, fenced_at(points, mark.owner, mark.at))
                # a held one never hides an earlier one that was not
                found[(queue, mark.placement, early.placement, overlap.held)] = overlap
    return sorted(found.values(), key=lambda o: o.late.at)
