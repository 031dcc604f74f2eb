"""What clients felt of each fault, read from the history (issue 41).

- **Outage**: for each fault and each confirmed publisher, the longest time
  without a confirm that overlaps the fault (from its start to its recovery):
  what an application publishing through it saw, reconnection included.
  Reported per fault kind as median, p99 and max.
- **Stop confirming**: for a fault that cuts one server off from the others
  (``isolate``, ``unplug``, the minority of a ``split``), how long after the
  cut that server still confirmed publishes: its clients stay connected to it
  (bar ``unplug``), and it must stop once it cannot reach a majority, within
  its lease.
- **Stop delivering**: the same for deliveries to its consumers, as the
  consumers handled them: an upper bound, since a consumer handles what its
  prefetch buffer held after the server sent it (at the workload's consume
  rate, up to a second or so later). An owner cut off sends only what its
  replicas acked (the replication gate), and its queues are soon another
  server's.

Both are measurements, not pass or fail; the checker's counts stay the verdict.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tests.faults.history import ACK, Fault, History, Publish, is_flood

#: the faults that leave one server on its own, its clients connected to it
CUT_OFF = ("isolate", "unplug", "split")


@dataclass
class Timing:
    #: per fault kind: every (fault, publisher) outage, seconds
    outages: dict[str, list[float]] = field(default_factory=dict)
    #: per fault kind: per fault, seconds from the cut to the cut-off server's last confirm
    #: (0.0: it confirmed nothing after the cut)
    stop_confirming: dict[str, list[float]] = field(default_factory=dict)
    #: the same for its last delivery to a consumer connected to it
    stop_delivering: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {
            "outage": {k: summary(v) for k, v in self.outages.items()},  # type: ignore[dict-item]
            "stop_confirming": {k: summary(v) for k, v in self.stop_confirming.items()},  # type: ignore[dict-item]
            "stop_delivering": {k: summary(v) for k, v in self.stop_delivering.items()},  # type: ignore[dict-item]
        }

    def lines(self) -> list[str]:
        out = [f"{'client outage':<22}{'n':>6}{'median':>9}{'p99':>8}{'max':>8}"]
        for kind in sorted(self.outages):
            s = summary(self.outages[kind])
            out.append(
                f"{kind:<22}{int(s['n']):>6}{s['median']:>8.2f}s{s['p99']:>7.2f}s{s['max']:>7.2f}s"
            )
        for title, values in (
            ("cut-off server confirms", self.stop_confirming),
            ("cut-off server delivers", self.stop_delivering),
        ):
            if not values:
                continue
            out.append(f"{title:<22}{'n':>6}{'median':>9}{'p99':>8}{'max':>8}")
            for kind in sorted(values):
                s = summary(values[kind])
                out.append(
                    f"{kind:<22}{int(s['n']):>6}{s['median']:>8.2f}s"
                    f"{s['p99']:>7.2f}s{s['max']:>7.2f}s"
                )
        return out


def summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "median": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "p99": p99,
        "max": ordered[-1],
    }


def measure(history: History) -> Timing:
    acks: dict[str, list[Publish]] = defaultdict(list)
    for publish in history.publishes:
        if publish.outcome == ACK and not is_flood(publish.publisher):
            acks[publish.publisher].append(publish)
    for confirmed in acks.values():
        confirmed.sort(key=lambda p: p.done)
    timing = Timing()
    for fault in history.faults:
        end = fault.recovered or fault.end or fault.start
        for confirmed in acks.values():
            gap = _longest_gap([p.done for p in confirmed], fault.start, end)
            if gap is not None:
                timing.outages.setdefault(fault.kind, []).append(gap)
        if fault.kind in CUT_OFF:
            confirms = (
                p.done for confirmed in acks.values() for p in confirmed if p.server == fault.target
            )
            timing.stop_confirming.setdefault(fault.kind, []).append(_last_after(fault, confirms))
            handed = (d.at for d in history.deliveries if d.server == fault.target)
            timing.stop_delivering.setdefault(fault.kind, []).append(_last_after(fault, handed))
    return timing


def _longest_gap(times: list[float], start: float, end: float) -> float | None:
    """The longest interval between consecutive confirms that overlaps [start, end]
    (None: the publisher confirmed nothing before the fault, or nothing after it)."""
    before = [t for t in times if t <= start]
    after = [t for t in times if t >= end]
    if not before or not after:
        return None
    inside = [t for t in times if start < t < end]
    points = [before[-1], *inside, after[0]]
    return max(b - a for a, b in itertools.pairwise(points))


def _last_after(fault: Fault, times: Iterable[float]) -> float:
    """Seconds from the cut to the cut-off server's last confirm or delivery while it
    was cut off, before its heal began (0.0: none): a publish it held through the
    cut may well be confirmed the moment the heal lets it through. The cut is when
    it was in place (``Fault.cut``: applying it runs several ``ip`` commands, which on
    a loaded machine took up to seconds, and what was confirmed meanwhile was not
    cut off), else when it was asked for."""
    start = fault.cut or fault.start
    end = fault.healing or fault.end or fault.start
    return max((t - start for t in times if start < t <= end), default=0.0)
