"""A window of recent latency samples, for percentiles in the status and metrics.

Bounded: the last ``size`` samples only (a ring), so a server that runs for
months keeps the same few kilobytes, and percentiles describe the present.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class LatencyWindow:
    """The last ``size`` samples (seconds), their percentiles and the all-time max."""

    __slots__ = ("count", "max", "samples")

    def __init__(self, size: int = 1024) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self.count = 0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.count += 1
        if seconds > self.max:
            self.max = seconds

    def percentile(self, p: float) -> float | None:
        """The ``p``-th percentile (0-100) of the window, None when empty."""
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]

    def describe(self) -> dict[str, Any]:
        """p50/p99/max of the window in milliseconds, the max since start, the count."""
        recent = max(self.samples) if self.samples else None
        return {
            "count": self.count,
            "p50_ms": _ms(self.percentile(50)),
            "p99_ms": _ms(self.percentile(99)),
            "max_ms": _ms(recent),
            "max_ever_ms": _ms(self.max if self.count else None),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
