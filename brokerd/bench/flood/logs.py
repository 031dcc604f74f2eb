"""Issue 21's failure signatures and counting them in one broker log (pure).

The flood's verdict rests on these counts; kept free of I/O so a test can feed
it lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

#: issue 21's failure signatures: key -> (column title, substrings any of which marks a line)
SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "root_released": ("root released", ("root released",)),
    "lease_lost": ("lease: fewer than a quorum", ("fewer than a quorum",)),
    "no_quorum": ("no quorum", ("no quorum",)),
    "replica_dropped": ("replica dropped", ("stopped acking", "left the set")),
    "session_voided": ("session voided", ("session voided",)),
    "forwards_failed": ("forwards failed", ("unsettled (",)),
    "close_320": ("320 closes", ("code=320",)),
    "root_moved": ("root moved in flight", ("root moved while deliveries were in flight",)),
    "root_changed": ("root changed", ("root changed",)),
}

_FORWARDS_FAILED = re.compile(r"forwards to \S+ failed: (\d+) unsettled")
#: what brokerd logs for each of this benchmark's status polls (left out of excerpts)
_POLL_LINE = "ctl command=status"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _stamp(line: str) -> float | None:
    """The wall-clock time of a brokerd log line (``%(asctime)s``, local time)."""
    m = _STAMP.match(line)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def scan_log(
    lines: Iterable[str],
    start: float | None = None,
    end: float | None = None,
    context: int = 3,
) -> dict[str, Any]:
    """Count issue 21's signatures in one broker log.

    Lines stamped before ``start`` (wall clock: start-up) count as "before",
    after ``end`` as "after", the rest as "during"; lines without a stamp
    (tracebacks) take the previous one's. Returns per signature ``{"before",
    "during", "after", "first": {"t", "lines"}}`` (the first during or after
    the run, with ``context`` lines before it, the benchmark's own status
    polls left out) plus the sum of unsettled forwards the "forwards failed"
    lines name.
    """
    counts: dict[str, dict[str, Any]] = {
        key: {"before": 0, "during": 0, "after": 0, "first": None} for key in SIGNATURES
    }
    recent: list[str] = []
    unsettled = 0
    last_t: float | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        t = _stamp(line)
        if t is not None:
            last_t = t
        if _POLL_LINE in line:
            continue
        if start is not None and last_t is not None and last_t < start:
            phase = "before"
        elif end is not None and last_t is not None and last_t > end:
            phase = "after"
        else:
            phase = "during"
        for key, (_title, needles) in SIGNATURES.items():
            if not any(n in line for n in needles):
                continue
            entry = counts[key]
            entry[phase] += 1
            if phase == "before":
                continue
            if entry["first"] is None:
                entry["first"] = {"t": last_t, "lines": [*recent, line]}
            if key == "forwards_failed" and (m := _FORWARDS_FAILED.search(line)):
                unsettled += int(m.group(1))
        if context:
            recent.append(line)
            if len(recent) > context:
                recent.pop(0)
    return {"signatures": counts, "forwards_unsettled": unsettled}
