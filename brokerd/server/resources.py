"""Memory high watermark and disk free limit: the alarms that block publishers.

Memory is the process's resident set size, read ten times a second and
after every 16 MiB read from clients (a flood on loopback brings hundreds
of MB per 100 ms; this bounds the overshoot whatever the rate). Not an
accounting of bytes held by queues: that would cost something on every
publish and delivery (the hot path), and it would still miss what a
message really costs in Python (a 250-byte message is about 1 KiB of
objects), partial bodies, output buffers, the login executor and allocator
fragmentation. RSS is what the kernel's OOM killer and the operator see,
and it is what RabbitMQ itself uses by default
(``vm_memory_calculation_strategy = rss``). One read costs about 30 us
(psutil over ``/proc/self/statm``), so 10 Hz costs 0.03% of a core and
bounds the overshoot to what publishers can push in 100 ms.

Freed memory is not always given back by the C allocator, which would keep
RSS above the watermark after consumers drained the queues; while the
memory alarm is on, glibc's ``malloc_trim`` returns free heap pages to the
kernel once a second, before memory is read again.

Disk: the free space of the data directory's filesystem (``statvfs``, for
unprivileged users), once a second. The limit defaults to RabbitMQ's 50 MB.

An alarm blocks publishers through ``Server.block_publishers`` with cause
``memory`` or ``disk`` (``connection.blocked`` with RabbitMQ's reasons,
``low on memory`` / ``low on disk``, and their reading stops at their next
publish) and is reported as a broker alarm in statuses and dumps.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from brokerd.model.limits import Limits

log = logging.getLogger("brokerd.resources")

MEMORY_INTERVAL = 0.1
#: bytes read from clients after which memory is checked at once, between timer ticks:
#: a loopback flood can bring hundreds of MB in 100 ms, this bounds the overshoot
CHECK_EVERY_BYTES = 16 * 1024 * 1024
#: memory checks per disk check (once a second)
DISK_EVERY = 10
#: seconds between malloc_trim calls while the memory alarm is on
TRIM_INTERVAL = 1.0
BLOCK_REASONS = {"memory": "low on memory", "disk": "low on disk"}
#: a cgroup v1 "no limit" is a huge page-rounded number
_CGROUP_UNLIMITED = 1 << 60


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (for messages and the one-line dump)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def cgroup_memory_limit(root: Path = Path("/")) -> int | None:
    """The memory limit of this process's cgroup (v2 or v1), if it has one."""
    candidates = []
    with contextlib.suppress(OSError):
        for line in (root / "proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0":
                candidates.append(root / f"sys/fs/cgroup{path.rstrip('/')}/memory.max")
            elif "memory" in controllers.split(","):
                candidates.append(
                    root / f"sys/fs/cgroup/memory{path.rstrip('/')}/memory.limit_in_bytes"
                )
    candidates += [
        root / "sys/fs/cgroup/memory.max",
        root / "sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    for candidate in candidates:
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _CGROUP_UNLIMITED:
            return int(text)
        if text == "max" or text.isdigit():
            return None
    return None


def total_memory(root: Path = Path("/")) -> int:
    """The memory this process may use: the machine's, or its cgroup's if lower
    (a container's limit is what the OOM killer enforces)."""
    physical = psutil.virtual_memory().total
    limit = cgroup_memory_limit(root)
    return min(physical, limit) if limit else physical


def _malloc_trim() -> Callable[[], None] | None:
    """glibc's malloc_trim(0) from the process's own symbols, or None on another C
    library (no ``find_library``: that may run ldconfig at every server start)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


@dataclass
class ResourceAlarm:
    kind: str
    message: str
    since: float


class ResourceMonitor:
    """Watches memory and disk against ``limits`` (read at every check, so a reload
    applies at once) and sets or clears the ``memory`` and ``disk`` block causes.

    The readers are parameters so the alarm logic is tested without a real
    process filling up."""

    def __init__(
        self,
        limits: Callable[[], Limits],
        data_dir: Path,
        on_block: Callable[[str, str | None], None],
        *,
        read_memory: Callable[[], int] | None = None,
        read_disk_free: Callable[[Path], int] | None = None,
        total: int | None = None,
        clock: Callable[[], float] = time.time,
        trim: Callable[[], None] | None = None,
        share: int = 1,
    ) -> None:
        self.limits = limits
        #: a worker of ``brokerd --workers N`` watches 1/N of the host's watermark
        self.share = max(share, 1)
        self.data_dir = data_dir
        self.on_block = on_block
        process = psutil.Process()
        self.read_memory = read_memory or (lambda: process.memory_info().rss)
        self.read_disk_free = read_disk_free or (lambda path: psutil.disk_usage(str(path)).free)
        self.total_memory = total if total is not None else total_memory()
        self.clock = clock
        self.trim = trim if trim is not None else _malloc_trim()
        self.memory_used = 0
        #: bytes read from clients since memory was last checked (the shell adds them)
        self.received = 0
        self.disk_free: int | None = None
        self.alarms: dict[str, ResourceAlarm] = {}
        #: alarms raised elsewhere that block nothing (the store's integrity alarm):
        #: each returns ``alarm_list``'s entry, or None while all is well
        self.other_alarms: list[Callable[[], dict[str, Any] | None]] = []
        self._last_trim = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def memory_limit(self) -> int:
        return self.limits().memory_limit(self.total_memory) // self.share

    # -- checks ---------------------------------------------------------------------

    def check_memory(self) -> None:
        self.received = 0
        limit = self.memory_limit
        used = self.read_memory()
        if used >= limit and self.trim is not None:
            now = time.monotonic()
            if now - self._last_trim >= TRIM_INTERVAL:
                self._last_trim = now
                self.trim()  # freed heap pages back to the kernel, then look again
                used = self.read_memory()
        self.memory_used = used
        self._set(
            "memory",
            used >= limit,
            f"memory alarm: resident memory passed the high watermark of "
            f"{format_bytes(limit)}; publishers are blocked",
        )

    def check_disk(self) -> None:
        limit = self.limits().disk_free_limit
        try:
            free = self.read_disk_free(self.data_dir)
        except OSError as exc:
            log.warning("cannot read free disk space of %s: %s", self.data_dir, exc)
            return
        self.disk_free = free
        self._set(
            "disk",
            free < limit,
            f"disk alarm: free space on {self.data_dir} fell below the limit of "
            f"{format_bytes(limit)}; publishers are blocked",
        )

    def check(self) -> None:
        self.check_memory()
        self.check_disk()

    def _set(self, kind: str, on: bool, message: str) -> None:
        alarm = self.alarms.get(kind)
        if on and (alarm is None or alarm.message != message):
            if alarm is None:
                log.warning("%s (%s)", message, self._detail(kind))
                self.on_block(kind, BLOCK_REASONS[kind])
            self.alarms[kind] = ResourceAlarm(kind, message, alarm.since if alarm else self.clock())
        elif not on and alarm is not None:
            del self.alarms[kind]
            log.warning("%s alarm cleared (%s); publishers may publish", kind, self._detail(kind))
            self.on_block(kind, None)

    def _detail(self, kind: str) -> str:
        if kind == "memory":
            return f"{format_bytes(self.memory_used)} of {format_bytes(self.memory_limit)}"
        free = format_bytes(self.disk_free or 0)
        return f"{free} free, limit {format_bytes(self.limits().disk_free_limit)}"

    # -- reports ----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Memory against the watermark, disk free against its limit, the alarms."""
        limits = self.limits()
        relative = limits.vm_memory_high_watermark_bytes is None
        return {
            "memory": {
                "used": self.memory_used,
                "limit": self.memory_limit,
                "total": self.total_memory,
                "watermark": limits.vm_memory_high_watermark if relative else None,
                "share": self.share,
                "alarm": "memory" in self.alarms,
            },
            "disk": {
                "free": self.disk_free,
                "limit": limits.disk_free_limit,
                "path": str(self.data_dir),
                "alarm": "disk" in self.alarms,
            },
        }

    def alarm_list(self) -> list[dict[str, Any]]:
        """The active alarms as the console link's ``view.alarms`` lists them."""
        alarms = [
            {"kind": a.kind, "message": a.message, "since": a.since} for a in self.alarms.values()
        ]
        for other in self.other_alarms:
            alarm = other()
            if alarm is not None:
                alarms.append(alarm)
        return alarms

    # -- the timer --------------------------------------------------------------------

    def start(self) -> None:
        """Check at once (a disk already below the limit blocks the first publish), then
        keep checking on the running loop."""
        self.check()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(MEMORY_INTERVAL)
            ticks += 1
            try:
                self.check_memory()
                if ticks % DISK_EVERY == 0:
                    self.check_disk()
            except Exception:  # a failing read must not stop the watch for good
                log.exception("resource check failed")
