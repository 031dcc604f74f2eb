"""Server process ids (spids): unique per process start, ordered by seniority."""

from __future__ import annotations

import os
import secrets
import time


def make_spid(start_time: float | None = None) -> str:
    """``<start ms, hex, fixed width>-<pid>-<random>``: sorting spids sorts by start time."""
    start_ms = int((start_time if start_time is not None else time.time()) * 1000)
    return f"{start_ms:012x}-{os.getpid()}-{secrets.token_hex(2)}"


def spid_start_time(spid: str) -> float:
    """The start time (seconds since the epoch) embedded in a spid."""
    return int(spid.split("-", 1)[0], 16) / 1000
