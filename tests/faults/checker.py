"""The checker: what a history says about the cluster's delivery guarantees.

Pure code over a ``History`` (no broker, no clock), so it is tested on
hand-made histories. The must-be-zero counts are the guarantees of
DESIGN.md section 5 that a client can observe:

- ``lost``: confirmed (publisher ack) and never delivered to anyone, after a
  drain that emptied the queues;
- ``unflagged_duplicates``: a message delivered unflagged (redelivered=false)
  more than once. The broker flags every delivery but the first; a client
  records a delivery when the application takes it from its buffer, so a
  copy delivered first may be recorded after a flagged redelivery to
  another consumer (its server lost the root meanwhile): the guarantee is
  one unflagged copy per message, whatever the recorded order;
- ``order_violations``: per publisher, a consumer connection receiving one of
  its messages after a later one (first deliveries not flagged redelivered
  only: redeliveries are allowed to come out of order);
- ``unknown``: a delivery of something no publisher sent.

Each loss is attributed to a fault, for the soak's per-kind figures (never
for pass/fail): a queue hands out one publisher's messages in publish order,
so a lost message was destroyed after it was sent and before the queue
first delivered a later message of the same publisher (its *skip*). Of the
faults in force in that window, the one that started last is blamed (a
harmless fault before it, while the message waited in a backlog, is not);
a loss with no fault in its window counts under ``none``. Likewise a message
delivered out of order was held up between its send and the delivery of the
later message that overtook it, and an unflagged duplicate came back between
its first delivery and this one.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.faults.history import ACK, Fault, History, Publish

NO_FAULT = "none"
EXAMPLES = 10


@dataclass
class Report:
    publishes: int = 0
    confirmed: int = 0
    not_confirmed: dict[str, int] = field(default_factory=dict)
    deliveries: int = 0
    received: int = 0  # distinct published messages delivered at least once
    received_unconfirmed: int = 0  # nacked or unanswered, delivered all the same (allowed)
    redelivered: int = 0  # deliveries flagged redelivered
    lost: int = 0
    unflagged_duplicates: int = 0
    order_violations: dict[str, int] = field(default_factory=dict)
    unknown: int = 0
    drained: bool = False
    faults: dict[str, int] = field(default_factory=dict)
    faults_on_root: dict[str, int] = field(default_factory=dict)  # the target was the root
    lost_by_fault: dict[str, int] = field(default_factory=dict)
    duplicates_by_fault: dict[str, int] = field(default_factory=dict)
    order_by_fault: dict[str, int] = field(default_factory=dict)
    recovery: dict[str, dict[str, float]] = field(default_factory=dict)
    per_fault: list[dict[str, Any]] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def order_violation_total(self) -> int:
        return sum(self.order_violations.values())

    def must_be_zero(self) -> dict[str, int]:
        return {
            "lost": self.lost,
            "unflagged_duplicates": self.unflagged_duplicates,
            "order_violations": self.order_violation_total,
            "unknown": self.unknown,
        }

    def ok(self) -> bool:
        return self.drained and not any(self.must_be_zero().values())

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok()}

    def format(self) -> str:
        lines = [
            f"publishes {self.publishes}: confirmed {self.confirmed}, not confirmed "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.not_confirmed.items())) or "0"),
            f"deliveries {self.deliveries}: received {self.received} distinct "
            f"({self.received_unconfirmed} of them unconfirmed), {self.redelivered} flagged "
            "redelivered",
            f"drained: {'yes' if self.drained else 'NO (queues not empty or still delivering)'}",
            "must be 0: "
            + ", ".join(f"{k} {v}" for k, v in self.must_be_zero().items())
            + ("" if not self.order_violations else f" (per publisher {self.order_violations})"),
            f"{'fault kind':<22}{'faults':>7}{'on root':>8}{'lost':>8}{'lost/fault':>11}"
            f"{'dups':>6}{'order':>7}{'settled median':>16}{'max':>7}",
        ]
        blamed = set(self.lost_by_fault) | set(self.duplicates_by_fault) | set(self.order_by_fault)
        for kind in sorted(set(self.faults) | blamed):
            count = self.faults.get(kind, 0)
            lost = self.lost_by_fault.get(kind, 0)
            rec = self.recovery.get(kind, {})
            lines.append(
                f"{kind:<22}{count:>7}{self.faults_on_root.get(kind, 0):>8}{lost:>8}"
                f"{(lost / count if count else 0):>11.1f}"
                f"{self.duplicates_by_fault.get(kind, 0):>6}{self.order_by_fault.get(kind, 0):>7}"
                f"{rec.get('median', float('nan')):>15.2f}s{rec.get('max', float('nan')):>6.2f}s"
            )
        for name, items in self.examples.items():
            if items:
                lines.append(f"{name}: " + "; ".join(items))
        lines.append("OK" if self.ok() else "NOT OK")
        return "\n".join(lines)


def check(history: History) -> Report:
    """Everything the report says, from the history alone."""
    report = Report(drained=history.drained)
    published: dict[tuple[str, int], Publish] = {}
    for p in history.publishes:
        published[(p.publisher, p.seq)] = p
    report.publishes = len(published)
    outcomes = Counter(p.outcome for p in published.values())
    report.confirmed = outcomes.pop(ACK, 0)
    report.not_confirmed = dict(sorted(outcomes.items()))

    faults = sorted(history.faults, key=lambda f: f.start)

    def blame(since: float, until: float) -> str:
        i = _culprit(faults, since, until)
        return NO_FAULT if i is None else faults[i].kind

    duplicates: Counter[str] = Counter()
    late: Counter[str] = Counter()
    deliveries = sorted(history.deliveries, key=lambda d: d.at)  # stable: per-thread order kept
    report.deliveries = len(deliveries)
    seen: dict[tuple[str, int], float] = {}  # first delivery time
    unflagged: set[tuple[str, int]] = set()  # delivered once without the flag
    # per (consumer, session): per publisher, the highest first delivery so far, and when
    highest: dict[tuple[str, int], dict[str, tuple[int, float]]] = defaultdict(dict)
    order: Counter[str] = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    for d in deliveries:
        key = (d.publisher, d.seq)
        report.redelivered += d.redelivered
        if key not in published:
            report.unknown += 1
            _example(examples, "unknown", f"{d.publisher}:{d.seq} to {d.consumer}")
            continue
        first_unflagged = not d.redelivered and key not in unflagged
        if not d.redelivered:
            unflagged.add(key)
        if key in seen:
            if not d.redelivered and not first_unflagged:
                report.unflagged_duplicates += 1
                duplicates[blame(seen[key], d.at)] += 1
                _example(
                    examples,
                    "unflagged_duplicates",
                    f"{d.publisher}:{d.seq} again to {d.consumer}/{d.session} on [{d.server}]",
                )
            continue
        seen[key] = d.at
        if d.redelivered:
            continue
        top = highest[(d.consumer, d.session)]
        before, overtaken_at = top.get(d.publisher, (-1, 0.0))
        if d.seq < before:
            order[d.publisher] += 1
            late[blame(published[key].sent, overtaken_at)] += 1
            _example(
                examples,
                "order_violations",
                f"{d.consumer}/{d.session} got {d.publisher}:{d.seq} after {d.publisher}:{before}",
            )
        else:
            top[d.publisher] = (d.seq, d.at)
    report.order_violations = dict(sorted(order.items()))
    report.duplicates_by_fault = dict(sorted(duplicates.items()))
    report.order_by_fault = dict(sorted(late.items()))
    report.received = len(seen)
    report.received_unconfirmed = sum(1 for k in seen if published[k].outcome != ACK)

    lost = sorted(
        (p for k, p in published.items() if p.outcome == ACK and k not in seen),
        key=lambda p: (p.publisher, p.seq),
    )
    report.lost = len(lost)
    examples["lost"] = _runs(published, lost)[:EXAMPLES]
    _attribute(history, published, seen, lost, report)
    report.examples = dict(examples)
    return report


def _example(examples: dict[str, list[str]], name: str, text: str) -> None:
    if len(examples[name]) < EXAMPLES:
        examples[name].append(text)


def _runs(published: dict[tuple[str, int], Publish], lost: list[Publish]) -> list[str]:
    """Runs of lost messages, consecutive among their publisher's sends to one queue
    (a publisher spreads over the queues, so its sequence numbers step)."""
    missing = {(p.publisher, p.seq) for p in lost}
    streams: dict[tuple[str, str], list[int]] = defaultdict(list)
    for p in sorted(published.values(), key=lambda p: (p.publisher, p.seq)):
        streams[(p.publisher, p.queue)].append(p.seq)
    runs: list[str] = []
    for (publisher, queue), seqs in streams.items():
        start: int | None = None
        count = 0
        for seq in [*seqs, None]:
            if seq is not None and (publisher, seq) in missing:
                start, count = (seq if start is None else start), count + 1
                last = seq
                continue
            if start is not None:
                span = f"{start}" if count == 1 else f"{start}..{last} ({count})"
                runs.append(f"{publisher}>{queue} {span}")
                start, count = None, 0
    return runs


def _culprit(faults: list[Fault], since: float, until: float) -> int | None:
    """The fault (index into ``faults``, sorted by start) that started last before
    ``until`` among those still in force at ``since`` or later."""
    i = bisect.bisect_left([f.start for f in faults], until)
    while i > 0:
        i -= 1
        if faults[i].end is None or faults[i].end >= since:
            return i
    return None


def _skips(
    published: dict[tuple[str, int], Publish], seen: dict[tuple[str, int], float]
) -> dict[tuple[str, int], float]:
    """For every message, the first delivery of a later one of its publisher to its
    queue (infinity if none came)."""
    streams: dict[tuple[str, str], list[Publish]] = defaultdict(list)
    for p in published.values():
        streams[(p.publisher, p.queue)].append(p)
    skips: dict[tuple[str, int], float] = {}
    for stream in streams.values():
        later = float("inf")
        for p in sorted(stream, key=lambda p: p.seq, reverse=True):
            skips[(p.publisher, p.seq)] = later
            later = min(later, seen.get((p.publisher, p.seq), later))
    return skips


def _attribute(
    history: History,
    published: dict[tuple[str, int], Publish],
    seen: dict[tuple[str, int], float],
    lost: list[Publish],
    report: Report,
) -> None:
    """Per kind: faults, losses (see the module docstring) and time to a settled root."""
    faults = sorted(history.faults, key=lambda f: f.start)
    skips = _skips(published, seen) if lost else {}
    per_fault = [0] * len(faults)
    by_kind: Counter[str] = Counter()
    for p in lost:
        i = _culprit(faults, p.sent, skips[(p.publisher, p.seq)])
        if i is None:
            by_kind[NO_FAULT] += 1
        else:
            per_fault[i] += 1
            by_kind[faults[i].kind] += 1
    report.faults = dict(sorted(Counter(f.kind for f in faults).items()))
    on_root = Counter(f.kind for f in faults if f.role == "root" or f.peer_role == "root")
    report.faults_on_root = dict(sorted(on_root.items()))
    report.lost_by_fault = dict(sorted(by_kind.items()))
    took: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if f.recovered is not None:
            took[f.kind].append(f.recovered - f.start)
    report.recovery = {
        kind: {"median": statistics.median(values), "max": max(values)}
        for kind, values in sorted(took.items())
    }
    report.per_fault = [
        {
            "kind": f.kind,
            "target": f.target,
            "role": f.role,
            "peer": f.peer,
            "peer_role": f.peer_role,
            "start": f.start,
            "held": None if f.end is None else round(f.end - f.start, 3),
            "recovered": None if f.recovered is None else round(f.recovered - f.start, 3),
            "lost": per_fault[i],
            "note": f.note,
        }
        for i, f in enumerate(faults)
    ]
