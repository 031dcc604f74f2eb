"""The report's options and error, without Spark (the CLI builds them before Spark starts)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

#: seconds a broker's link may take to come back after a console gap (its reconnect backoff
#: plus a heartbeat) before its own silence counts as an outage
RECONNECT_ALLOWANCE = 15.0


class ReportError(ValueError):
    """The lake or the arguments cannot give a report (missing tables, empty period)."""


@dataclass
class ReportOptions:
    lake: str
    out: str
    start: datetime | None = None
    end: datetime | None = None
    master: str | None = None
    interval: float | None = None
    gap_intervals: int = 3
    message_bytes: int = 1000
    link_gbps: float = 1.0
    driver_memory: str | None = None
    flap_window: float = 300.0
    flap_min_transitions: int = 4
    backlog_min_seconds: float = 300.0
    backlog_min_growth: int = 100
    trend_window_seconds: float = 900.0
    reconnect_allowance: float = RECONNECT_ALLOWANCE
