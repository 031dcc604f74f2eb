"""``--workers``: the option's value, and whether this platform can run several workers.

Several workers share one listening port through SO_REUSEPORT (each binds it
itself and the kernel spreads the connections), so a platform without it runs
one worker only.
"""

from __future__ import annotations

import argparse
import os
import re
import socket

#: the most workers one host runs: far more than any machine's cores, and a typo
#: such as 2000 is refused instead of starting two thousand brokers
MAX_WORKERS = 256

_DIGITS = re.compile(r"[0-9]+")
#: ``--workers 12345`` is too many, not "not a number": the count is compared
#: without converting more digits than a valid count can have
_MOST_DIGITS = 4

NO_REUSEPORT = (
    "--workers N needs SO_REUSEPORT, which this platform does not have: run one worker"
    " (--workers 1)"
)
REUSEPORT_REFUSED = (
    "--workers N needs SO_REUSEPORT, which this platform refuses ({reason}): run one worker"
    " (--workers 1)"
)


def available_cpus() -> int:
    """The cores this process may run on: its affinity mask where the platform has
    one (a container or ``taskset`` may allow fewer than the machine has), else
    the machine's count, and at least 1."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    count = len(getaffinity(0)) if getaffinity is not None else os.cpu_count()
    return max(count or 1, 1)


def _shown(value: str) -> str:
    """``value`` as the error message shows it: quoted when it is empty or has
    spaces or unprintable characters, which would be invisible bare."""
    plain = bool(value) and value.isprintable() and value.strip() == value
    return value if plain else repr(value)


def parse_workers(value: str, cpu_count: int | None = None) -> int:
    """The worker count ``--workers value`` asks for: ``auto`` for one per core
    (``cpu_count`` stands in for this machine's in tests), else a count
    1..MAX_WORKERS in ASCII digits. ``int()`` alone would also take " 2", "+2"
    and "١٢", which a shell script could pass by mistake.

    Raises argparse.ArgumentTypeError, so argparse reports the value as the
    option's error."""
    if value == "auto":
        cores = available_cpus() if cpu_count is None else cpu_count
        return min(max(cores, 1), MAX_WORKERS)
    shown = _shown(value)
    if not _DIGITS.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"--workers {shown}: not a number (a count 1..{MAX_WORKERS}, or auto)"
        )
    significant = value.lstrip("0")
    if len(significant) > _MOST_DIGITS or int(significant or "0") > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"--workers {shown}: at most {MAX_WORKERS} workers")
    count = int(significant or "0")
    if count < 1:
        raise argparse.ArgumentTypeError(f"--workers {shown}: need at least 1 worker")
    return count


def reuseport_problem() -> str | None:
    """Why this platform cannot run several workers on one port, or None if it can:
    the constant may exist where the kernel refuses the option, so a loopback
    socket tries it."""
    option = getattr(socket, "SO_REUSEPORT", None)
    if option is None:
        return NO_REUSEPORT
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, option, 1)
            probe.bind(("127.0.0.1", 0))
    except OSError as exc:
        return REUSEPORT_REFUSED.format(reason=exc.strerror or exc)
    return None
