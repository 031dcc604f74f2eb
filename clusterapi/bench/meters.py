"""What the console's load benches measure: the CPU and memory of its processes, and
how late a broker's status is visible in its database (``percentile``/``summary``
of the delays)."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import Any

import psutil


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on ``port`` (the console's Daphne)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return conn.pid
    return None


class CpuMeter:
    """CPU seconds of a process (and its children) between ``start`` and ``stop``."""

    def __init__(self, pid: int, children: bool) -> None:
        self.root = psutil.Process(pid)
        self.children = children
        self._start: dict[int, float] = {}
        self.seconds = 0.0
        #: resident memory at ``stop`` (the process and its children), MiB
        self.rss_mib = 0.0

    def _procs(self) -> list[psutil.Process]:
        procs = [self.root]
        if self.children:
            procs += self.root.children(recursive=True)
        return procs

    def _times(self) -> dict[int, float]:
        out = {}
        for proc in self._procs():
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
        return out

    def start(self) -> None:
        self._start = self._times()

    def stop(self) -> None:
        end = self._times()
        self.seconds = sum(v - self._start.get(pid, 0.0) for pid, v in end.items())
        rss = 0
        for proc in self._procs():
            with contextlib.suppress(psutil.Error):
                rss += proc.memory_info().rss
        self.rss_mib = rss / 2**20


class DelayPoller(threading.Thread):
    """Polls the console's database for new heartbeat samples of the fake brokers."""

    def __init__(self, names: list[str], poll: float) -> None:
        super().__init__(daemon=True)
        self.names = names
        self.poll = poll
        self.delays: list[tuple[str, float, float]] = []  # (broker, status time, delay)
        self.measuring = False
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        from django.db import close_old_connections

        from clusterapi.models import HeartbeatSample

        seen: set[tuple[str, float]] = set()
        since = time.time() - 1
        while not self.stopping.is_set():
            rows = HeartbeatSample.objects.filter(
                broker__name__in=self.names, time__gte=_aware(since)
            ).values_list("broker__name", "time")
            now = time.time()
            for name, sent in rows:
                key = (name, sent.timestamp())
                if key in seen:
                    continue
                seen.add(key)
                if self.measuring:
                    self.delays.append((name, key[1], now - key[1]))
            since = now - 30  # a status can commit long after its time; keep a window
            seen = {k for k in seen if k[1] >= since - 1}
            close_old_connections()
            self.stopping.wait(self.poll)


def _aware(t: float) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, tz=dt.UTC)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary(delays: list[float]) -> dict[str, Any]:
    return {
        "samples": len(delays),
        "p50": round(percentile(delays, 50), 1),
        "p95": round(percentile(delays, 95), 1),
        "max": round(max(delays), 1) if delays else None,
        "mean": round(statistics.fmean(delays), 1) if delays else None,
    }
