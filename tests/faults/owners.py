"""No queue has two owners that both confirm (issue 41), from the servers' own logs.

An owner marks its confirms (``brokerd/cluster/queues/replication/marks.py``:
``confirms queue=Q epoch=N``, at most every 20 ms per queue, on servers started
with ``--enable-fault-injection``), naming the placement it owns the queue by.
Every server logs with millisecond timestamps from the one clock they share, so
per queue the marks of all servers can be put in one order: a mark of an
earlier epoch after one of a later epoch is an owner confirming after its
successor began to, which is what a partition must never allow (the later
owner may not hold what the earlier one confirmed)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

MARK = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO (?:worker-\d+ )?brokerd\.cluster\.confirms: "
    r"confirms queue=(\S+) epoch=(\d+)$"
)


@dataclass(frozen=True)
class Mark:
    at: float
    queue: str
    epoch: int
    server: str


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
            f"{self.queue}: epoch {self.late.epoch} on {self.late.server} confirmed "
            f"{self.seconds * 1000:.0f} ms after epoch {self.early.epoch} on "
            f"{self.early.server} had"
        )


def marks(server: str, log_text: str) -> list[Mark]:
    out = []
    for line in log_text.splitlines():
        match = MARK.match(line)
        if match is not None:
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append(Mark(at, match[2], int(match[3]), server))
    return out


def overlaps(all_marks: Iterable[Mark]) -> list[Overlap]:
    """Per queue, each mark that comes (strictly later) after a mark of a later epoch;
    one per pair of epochs, the latest such mark."""
    found: dict[tuple[str, int, int], Overlap] = {}
    by_queue: dict[str, list[Mark]] = {}
    for mark in all_marks:
        by_queue.setdefault(mark.queue, []).append(mark)
    for queue, queue_marks in by_queue.items():
        first_of: dict[int, Mark] = {}
        for mark in sorted(queue_marks, key=lambda m: (m.at, m.epoch)):
            first_of.setdefault(mark.epoch, mark)
            later = [m for e, m in first_of.items() if e > mark.epoch and m.at < mark.at]
            if later:
                early = min(later, key=lambda m: m.at)
                found[(queue, mark.epoch, early.epoch)] = Overlap(queue, early, mark)
    return sorted(found.values(), key=lambda o: o.late.at)
