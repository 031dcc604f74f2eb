"""No queue has two owners that both confirm (issue 41), from the servers' own logs.

An owner marks its confirms (``brokerd/cluster/queues/replication/marks.py``:
``confirms queue=Q term=T epoch=N``, at most every 20 ms per queue, on servers
started with ``--enable-fault-injection``), naming the placement it owns the
queue by: epoch N of the state log of term T.
Every server logs with millisecond timestamps from the one clock they share, so
per queue the marks of all servers can be put in one order: a mark of an
earlier (term, epoch) after one of a later is an owner confirming after its
successor began to (epochs alone start again when a whole-cluster restart
seeds the state log anew; its term is a later one), which is what a partition
must never allow (the later owner may not hold what the earlier one confirmed)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

MARK = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO (?:worker-\d+ )?brokerd\.cluster\.confirms: "
    r"confirms queue=(\S+) term=(\d+) epoch=(\d+)$"
)


@dataclass(frozen=True)
class Mark:
    at: float
    queue: str
    term: int
    epoch: int
    server: str

    @property
    def placement(self) -> tuple[int, int]:
        return (self.term, self.epoch)


@dataclass(frozen=True)
class Overlap:
    """``late`` (an earlier epoch's owner) confirmed after ``early`` (a later one's) had."""

    queue: str
    early: Mark
    late: Mark

    @property
    def seconds(self) -> float:
        return self.late.at - self.early.at

    def __str__(self) -> str:
        return (
            f"{self.queue}: term {self.late.term} epoch {self.late.epoch} on "
            f"{self.late.server} confirmed {self.seconds * 1000:.0f} ms after term "
            f"{self.early.term} epoch {self.early.epoch} on {self.early.server} had"
        )


def marks(server: str, log_text: str) -> list[Mark]:
    out = []
    for line in log_text.splitlines():
        match = MARK.match(line)
        if match is not None:
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append(Mark(at, match[2], int(match[3]), int(match[4]), server))
    return out


def overlaps(all_marks: Iterable[Mark]) -> list[Overlap]:
    """Per queue, each mark that comes (strictly later) after a mark of a later
    placement; one per pair of placements, the latest such mark."""
    found: dict[tuple[str, tuple[int, int], tuple[int, int]], Overlap] = {}
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
                found[(queue, mark.placement, early.placement)] = Overlap(queue, early, mark)
    return sorted(found.values(), key=lambda o: o.late.at)
