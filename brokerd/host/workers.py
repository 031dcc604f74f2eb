"""``--workers``: the option's value, and whether this platform can run several workers.

Several workers share one listening port through SO_REUSEPORT (each binds it
itself and the kernel spreads the connections), so a platform without it runs
one worker only.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
from pathlib import Path

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


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its affinity mask where the platform has
    one (``taskset``, a cpuset), else the machine's count; no more than its cgroup's
    CPU quota allows (``docker run --cpus 2``, a Kubernetes CPU limit), rounded up;
    and at least 1."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    count = len(getaffinity(0)) if getaffinity is not None else os.cpu_count()
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        count = min(count or quota, quota)
    return max(count or 1, 1)


def cgroup_cpu_quota(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> int | None:
    """Whole cores this process's cgroup may use, rounded up: cgroup v2's ``cpu.max``
    (``QUOTA PERIOD``, ``max`` for none) or v1's ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us`` (-1 for none). None without a limit or a cgroup to read."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        relative = path.lstrip("/")
        if controllers == "":  # v2: one unified hierarchy
            text = _read(root / relative / "cpu.max")
            if text is not None and len(text.split()) == 2 and text.split()[0] != "max":
                return _cores(*text.split())
        elif "cpu" in controllers.split(","):
            folder = root / controllers / relative
            quota = _read(folder / "cpu.cfs_quota_us")
            period = _read(folder / "cpu.cfs_period_us")
            if quota is not None and period is not None:
                return _cores(quota, period)
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cores(quota: str, period: str) -> int | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return max(math.ceil(q / p), 1) if q > 0 and p > 0 else None


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
