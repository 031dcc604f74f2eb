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
  only: redeliveries are allowed to come out of order). A message whose
  publish outcome is unknown (its connection failed under the publish) is not
  held to it: the publisher went on on a new connection, AMQP orders nothing
  across connections, and a server keeps such a publish (it may never have
  reached the root: ``orphans``) and delivers it, unconfirmed, once a root
  takes it, after what the next connection published meanwhile;
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

Flood mode (``history.flood``: unconfirmed publishers) adds, never for
pass/fail: ``unconfirmed_lost``, messages written to a connection and never
delivered (``lost`` stays about confirmed messages only), each blamed as
above within its connection: it was destroyed after it was written and
before its queue first delivered a later message of the same connection, or,
with none, before the connection ended with an error (what was still in the
socket then may never have been read); a fault counts until the cluster
settled after it. A loss with a later message of its connection delivered
was read by the broker first (TCP keeps the order), hence
``unconfirmed_lost_read``. Flood messages count in ``unflagged_duplicates``
and ``order_violations`` as the others, except that order holds per
publisher *connection*: AMQP orders nothing across connections, and a
message still in a dead connection's socket can be read after the next
connection's.
"""

from __future__ import annotations

import bisect
import statistics
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.faults.history import (
    ACK,
    UNKNOWN,
    Fault,
    FloodPublisher,
    FloodSession,
    History,
    Publish,
)
from tests.faults.timing import Timing, measure

NO_FAULT = "none"
EXAMPLES = 10
INF = float("inf")


@dataclass
class Report:
    publishes: int = 0
    confirmed: int = 0
    not_confirmed: dict[str, int] = field(default_factory=dict)
    deliveries: int = 0
    received: int = 0  # distinct published messages delivered at least once
    received_unconfirmed: int = 0  # nacked or unanswered, delivered all the same (allowed)
    #: of those, first delivered after a later message of their publisher (its next
    #: connection's: allowed, see ``order_violations``)
    unknown_late: int = 0
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
    # flood mode (unconfirmed publishers); reported, never must-be-zero
    flood_publishers: int = 0
    unconfirmed_published: int = 0  # written to a connection (basic_publish returned)
    unconfirmed_cut: int = 0  # their connection failed under the publish: not counted
    unconfirmed_deliveries: int = 0
    unconfirmed_received: int = 0  # distinct flood messages delivered at least once
    unconfirmed_redelivered: int = 0
    unconfirmed_lost: int = 0  # written, never delivered
    unconfirmed_lost_read: int = 0  # of those, read by the broker before it lost them
    unconfirmed_lost_by_fault: dict[str, int] = field(default_factory=dict)
    unconfirmed_lost_read_by_fault: dict[str, int] = field(default_factory=dict)
    #: what clients felt: outages per fault kind, and how long a cut-off server still
    #: confirmed (``timing.py``; measured, never must-be-zero)
    timing: Timing = field(default_factory=Timing)
    #: pairs of servers whose terms as root overlapped (their own logs, to the ms)
    two_roots: int = 0
    #: a queue's owner that confirmed after its successor had (``owners.py``)
    two_owners: list[str] = field(default_factory=list)
    #: the same, of events its replicas held before they fenced it (informational:
    #: the successor took the queue from those copies)
    late_held_confirms: list[str] = field(default_factory=list)

    @property
    def order_violation_total(self) -> int:
        return sum(self.order_violations.values())

    def must_be_zero(self) -> dict[str, int]:
        return {
            "lost": self.lost,
            "unflagged_duplicates": self.unflagged_duplicates,
            "order_violations": self.order_violation_total,
            "unknown": self.unknown,
            "two_roots": self.two_roots,
            "two_owners_confirming": len(self.two_owners),
        }

    def ok(self) -> bool:
        return self.drained and not any(self.must_be_zero().values())

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "timing": self.timing.to_dict(), "ok": self.ok()}

    def format(self) -> str:
        lines = [
            f"publishes {self.publishes}: confirmed {self.confirmed}, not confirmed "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.not_confirmed.items())) or "0"),
            f"deliveries {self.deliveries}: received {self.received} distinct "
            f"({self.received_unconfirmed} of them unconfirmed, {self.unknown_late} of those "
            f"after the next connection's), {self.redelivered} flagged redelivered",
        ]
        flood = self.flood_publishers > 0
        if flood:
            lines += self._flood_lines()
        lines += [
            f"drained: {'yes' if self.drained else 'NO (queues not empty or still delivering)'}",
            "must be 0: "
            + ", ".join(f"{k} {v}" for k, v in self.must_be_zero().items())
            + ("" if not self.order_violations else f" (per publisher {self.order_violations})"),
            f"{'fault kind':<22}{'faults':>7}{'on root':>8}{'lost':>8}{'lost/fault':>11}"
            f"{'dups':>6}{'order':>7}{'settled median':>16}{'max':>7}"
            + (f"{'unconf lost':>13}" if flood else ""),
        ]
        blamed = set(self.lost_by_fault) | set(self.duplicates_by_fault) | set(self.order_by_fault)
        for kind in sorted(set(self.faults) | blamed | set(self.unconfirmed_lost_by_fault)):
            count = self.faults.get(kind, 0)
            lost = self.lost_by_fault.get(kind, 0)
            rec = self.recovery.get(kind, {})
            lines.append(
                f"{kind:<22}{count:>7}{self.faults_on_root.get(kind, 0):>8}{lost:>8}"
                f"{(lost / count if count else 0):>11.1f}"
                f"{self.duplicates_by_fault.get(kind, 0):>6}{self.order_by_fault.get(kind, 0):>7}"
                f"{rec.get('median', float('nan')):>15.2f}s{rec.get('max', float('nan')):>6.2f}s"
                + (f"{self.unconfirmed_lost_by_fault.get(kind, 0):>13}" if flood else "")
            )
        lines += self.timing.lines()
        for name, items in self.examples.items():
            if items:
                lines.append(f"{name}: " + "; ".join(items))
        if self.two_owners:
            lines.append("two owners confirming: " + "; ".join(self.two_owners[:5]))
        if self.late_held_confirms:
            lines.append(
                f"late confirms of held events ({len(self.late_held_confirms)}, not failures): "
                + "; ".join(self.late_held_confirms[:3])
            )
        lines.append("OK" if self.ok() else "NOT OK")
        return "\n".join(lines)

    def _flood_lines(self) -> list[str]:
        """The flood figures: what was written unconfirmed, and where it was lost."""
        unfaulted = self.unconfirmed_lost_by_fault.get(NO_FAULT, 0)
        read = ", ".join(f"{k} {v}" for k, v in self.unconfirmed_lost_read_by_fault.items())
        return [
            f"flood ({self.flood_publishers} unconfirmed publishers): published "
            f"{self.unconfirmed_published} (+{self.unconfirmed_cut} cut off by their "
            f"connection's end), deliveries {self.unconfirmed_deliveries}: received "
            f"{self.unconfirmed_received} distinct, {self.unconfirmed_redelivered} flagged "
            "redelivered",
            f"unconfirmed_lost {self.unconfirmed_lost} of unconfirmed_published "
            f"{self.unconfirmed_published}: {self.unconfirmed_lost - unfaulted} at a fault, "
            f"{unfaulted} with no fault (row {NO_FAULT}); {self.unconfirmed_lost_read} read "
            "by the broker first (a later message of their connection was delivered)"
            + (f": {read}" if read else ""),
        ]


def check(history: History) -> Report:
    """Everything the report says, from the history alone."""
    report = Report(drained=history.drained)
    report.two_roots = int(history.meta.get("root_overlaps", 0))
    report.two_owners = list(history.meta.get("owner_overlaps", []))
    report.late_held_confirms = list(history.meta.get("owner_overlaps_held", []))
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
        if d.seq < before and published[key].outcome == UNKNOWN:
            report.unknown_late += 1  # its connection died under it: see the docstring
        elif d.seq < before:
            order[d.publisher] += 1
            late[blame(published[key].sent, overtaken_at)] += 1
            _example(
                examples,
                "order_violations",
                f"{d.consumer}/{d.session} got {d.publisher}:{d.seq} after {d.publisher}:{before}",
            )
        else:
            top[d.publisher] = (d.seq, d.at)
    flood = _flood_deliveries(history, blame, report, duplicates, late, order, examples)
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
    if history.flood:
        report.flood_publishers = len(history.flood)
        per_fault = _flood_losses(history, faults, flood, report, examples)
        for entry, count in zip(report.per_fault, per_fault, strict=True):
            entry["unconfirmed_lost"] = count
    report.examples = dict(examples)
    report.timing = measure(history)
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


def _culprit(
    faults: list[Fault], since: float, until: float, *, settled: bool = False
) -> int | None:
    """The fault (index into ``faults``, sorted by start) that started last before
    ``until`` among those still in force at ``since`` or later; ``settled``: a fault
    is in force until the cluster settled after it (else until it was undone)."""
    i = bisect.bisect_left([f.start for f in faults], until)
    while i > 0:
        i -= 1
        end = faults[i].end
        if settled and faults[i].recovered is not None:
            end = faults[i].recovered
        if end is None or end >= since:
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


@dataclass
class _FloodSeen:
    """One flood publisher's messages, indexed by sequence number (0 unused): the
    time of the first delivery and of the first without the redelivered flag
    (infinity: none), and which of those a pass has met already (bits 1 and 2)."""

    publisher: FloodPublisher
    firsts: list[int]  # each connection's first sequence number, for bisect
    first_at: array[float]
    first_unflagged_at: array[float]
    met: bytearray

    @classmethod
    def of(cls, publisher: FloodPublisher) -> _FloodSeen:
        size = publisher.end
        return cls(
            publisher,
            [s.first for s in publisher.sessions],
            array("d", [INF]) * size,
            array("d", [INF]) * size,
            bytearray(size),
        )

    def known(self, seq: int) -> bool:
        return 1 <= seq < len(self.first_at)

    def session(self, seq: int) -> int:
        """Index of the connection ``seq`` was published on."""
        return bisect.bisect_right(self.firsts, seq) - 1

    def sent_at(self, seq: int) -> float:
        """When ``seq`` was written (one cut off by its connection's end: that end)."""
        session = self.publisher.sessions[self.session(seq)]
        i = seq - session.first
        if i < len(session.sent):
            return session.sent[i]
        return session.opened if session.closed is None else session.closed


def _flood_deliveries(
    history: History,
    blame: Callable[[float, float], str],
    report: Report,
    duplicates: Counter[str],
    late: Counter[str],
    order: Counter[str],
    examples: dict[str, list[str]],
) -> dict[str, _FloodSeen]:
    """Unknown, duplicate and out-of-order flood deliveries, by the rules of the
    confirmed ones (the first delivery decides, by time; order per consumer
    connection, redeliveries excepted) but order per publisher connection. Two
    passes over the arrays instead of a sort of every delivery: the first finds
    each message's first deliveries, the second walks each consumer connection."""
    seen = {p.name: _FloodSeen.of(p) for p in history.flood}
    for stream in history.flood_deliveries:
        for publisher, seq, redelivered, at in stream.rows():
            report.unconfirmed_deliveries += 1
            report.unconfirmed_redelivered += redelivered
            s = seen.get(publisher)
            if s is None or not s.known(seq):
                report.unknown += 1
                _example(examples, "unknown", f"{publisher}:{seq} to {stream.consumer}")
                continue
            if at < s.first_at[seq]:
                s.first_at[seq] = at
            if not redelivered and at < s.first_unflagged_at[seq]:
                s.first_unflagged_at[seq] = at
    for stream in history.flood_deliveries:
        # per (publisher, its connection): the highest first delivery so far, and when
        top: dict[tuple[str, int], tuple[int, float]] = {}
        for publisher, seq, redelivered, at in stream.rows():
            s = seen.get(publisher)
            if s is None or not s.known(seq):
                continue
            first = at == s.first_at[seq] and not s.met[seq] & 1
            if first:
                s.met[seq] |= 1
            if redelivered:
                continue
            if at == s.first_unflagged_at[seq] and not s.met[seq] & 2:
                s.met[seq] |= 2  # the one unflagged copy allowed
            else:
                report.unflagged_duplicates += 1
                duplicates[blame(s.first_at[seq], at)] += 1
                _example(
                    examples,
                    "unflagged_duplicates",
                    f"{publisher}:{seq} again to {stream.consumer}/{stream.session} "
                    f"on [{stream.server}]",
                )
                continue
            if not first:
                continue
            connection = s.session(seq)
            before, overtaken_at = top.get((publisher, connection), (-1, 0.0))
            if seq < before:
                order[publisher] += 1
                late[blame(s.sent_at(seq), overtaken_at)] += 1
                _example(
                    examples,
                    "order_violations",
                    f"{stream.consumer}/{stream.session} got {publisher}:{seq} after "
                    f"{publisher}:{before} (its connection {connection + 1})",
                )
            else:
                top[(publisher, connection)] = (seq, at)
    report.unconfirmed_received = sum(1 for s in seen.values() for at in s.first_at if at < INF)
    return seen


def _flood_losses(
    history: History,
    faults: list[Fault],
    seen: dict[str, _FloodSeen],
    report: Report,
    examples: dict[str, list[str]],
) -> list[int]:
    """Count and blame the flood messages written and never delivered (see the module
    docstring); returns the count per fault (``faults`` sorted by start)."""
    per_fault = [0] * len(faults)
    by_kind: Counter[str] = Counter()
    read_by_kind: Counter[str] = Counter()
    runs: list[str] = []
    for publisher in history.flood:
        first_at = seen[publisher.name].first_at
        width = len(publisher.queues)
        for number, session in enumerate(publisher.sessions, 1):
            report.unconfirmed_published += len(session.sent)
            report.unconfirmed_cut += session.cut
            ended = session.closed if session.error and session.closed is not None else INF
            later = [INF] * width  # per queue: first delivery of a later message of this connection
            read = False  # a later message of this connection was delivered
            lost: list[tuple[int, str, bool]] = []
            for seq in range(session.end - 1, session.first - 1, -1):
                queue = seq % width
                if first_at[seq] < INF:
                    later[queue] = min(later[queue], first_at[seq])
                    read = True
                    continue
                i = seq - session.first
                if i >= len(session.sent):
                    continue  # cut off: maybe never written, not counted
                until = later[queue] if later[queue] < INF else ended
                culprit = _culprit(faults, session.sent[i], until, settled=True)
                kind = NO_FAULT if culprit is None else faults[culprit].kind
                if culprit is not None:
                    per_fault[culprit] += 1
                by_kind[kind] += 1
                read_by_kind[kind] += read
                report.unconfirmed_lost += 1
                report.unconfirmed_lost_read += read
                if len(runs) < EXAMPLES:
                    lost.append((seq, kind, read))
            if lost:
                runs += _flood_runs(publisher, number, session, lost[::-1])
    report.unconfirmed_lost_by_fault = dict(sorted(by_kind.items()))
    report.unconfirmed_lost_read_by_fault = {k: v for k, v in sorted(read_by_kind.items()) if v}
    examples["unconfirmed_lost"] = runs[:EXAMPLES]
    return per_fault


def _flood_runs(
    publisher: FloodPublisher, number: int, session: FloodSession, lost: list[tuple[int, str, bool]]
) -> list[str]:
    """Runs of lost flood messages of one connection, consecutive among its sends to one
    queue: ``f0#2@[1]>q 5..9 (3): kill-root, 3 read, ended StreamLostError``."""
    width = len(publisher.queues)
    ended = session.error.split(":", 1)[0] or "closed at the stop"
    by_queue: dict[int, list[tuple[int, str, bool]]] = defaultdict(list)
    for item in lost:
        by_queue[item[0] % width].append(item)
    runs: list[str] = []
    for queue, items in sorted(by_queue.items(), key=lambda kv: kv[1][0][0]):
        start = 0
        for end in range(1, len(items) + 1):
            if end < len(items) and items[end][0] == items[end - 1][0] + width:
                continue
            run = items[start:end]
            span = f"{run[0][0]}" if len(run) == 1 else f"{run[0][0]}..{run[-1][0]} ({len(run)})"
            kinds = ",".join(sorted({kind for _seq, kind, _read in run}))
            read = sum(r for _seq, _kind, r in run)
            runs.append(
                f"{publisher.name}#{number}@[{session.server}]>{publisher.queues[queue]} {span}: "
                f"{kinds}, {read} read, ended {ended}"
            )
            start = end
    return runs
