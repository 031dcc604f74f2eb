"""How late the event loop runs, and what the garbage collector costs it.

Every control message, every heartbeat and every client waits for the one
event loop; when it falls behind (a burst of work, a full collection over a
deep queue's millions of objects, a starved CPU) everything does. The watch
wakes every ``PERIOD`` and records how late it woke (``lag``), times each
collection of the oldest generation, and tells flow control (``on_lag``), so
that a loop falling behind slows the publishers feeding it instead of
letting statuses age (``brokerd.cluster.plane.flow``, cause ``event-loop``).

A lag says that the loop was held, not by what. While the watch is late a
sampler thread (``StallSampler``) reads the loop thread's stack, so that the
warning of a long lag names the code that held the loop: the one thing an
operator (or the next engineer) needs to act on it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from brokerd.cluster.latency import LatencyWindow

log = logging.getLogger("brokerd.server.loopwatch")

#: how often the watch wakes (seconds)
PERIOD = 0.05
#: a lag above this is logged (seconds)
LOG_ABOVE = 0.5
#: the sampler reads the loop thread's stack once the watch is this late (seconds)
SAMPLE_AFTER = 0.3
#: frames of each sampled stack kept (the innermost)
SAMPLE_DEPTH = 8


class StallSampler:
    """A daemon thread that samples the loop thread's stack while the loop is
    held: ``beat()`` is called from the loop at each watch wake-up, and
    ``take()`` returns what was sampled since the last one (most frequent first).

    It reads ``sys._current_frames``, which needs the GIL: a loop held by
    Python code gives it up every switch interval, so the sample lands inside
    the stall (a stall inside one C call that keeps the GIL shows that call)."""

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self._beat = time.monotonic()
        self._thread_id = threading.get_ident()
        self._samples: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread_id = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="stall-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        self._beat = time.monotonic()

    def take(self) -> list[tuple[str, int]]:
        with self._lock:
            samples, self._samples = self._samples, {}
        return sorted(samples.items(), key=lambda item: -item[1])

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            if time.monotonic() - self._beat < SAMPLE_AFTER:
                continue
            frame = sys._current_frames().get(self._thread_id)
            if frame is None:
                continue
            stack = traceback.extract_stack(frame, limit=SAMPLE_DEPTH)
            where = " < ".join(
                f"{entry.name} ({_short(entry.filename)}:{entry.lineno})"
                for entry in reversed(stack)
            )
            with self._lock:
                if len(self._samples) < 16 or where in self._samples:
                    self._samples[where] = self._samples.get(where, 0) + 1


def _short(filename: str) -> str:
    """``.../brokerd/cluster/link.py`` -> ``brokerd/cluster/link.py``."""
    for root in ("brokerd/", "site-packages/", "python3."):
        at = filename.rfind(root)
        if at >= 0:
            return filename[at:]
    return filename


class LoopWatch:
    """Samples the loop's lag; times full collections."""

    def __init__(self, on_lag: Callable[[float], None] | None = None) -> None:
        self.on_lag = on_lag
        self.lag = LatencyWindow(1200)  # the last minute
        self.gc = LatencyWindow(64)
        self.current = 0.0
        self._gc_started: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.sampler = StallSampler()

    def start(self) -> None:
        gc.callbacks.append(self._gc_event)
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()
        if self._gc_event in gc.callbacks:
            gc.callbacks.remove(self._gc_event)
        if self._task is not None:
            self._task.cancel()

    def _gc_event(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            took = time.perf_counter() - self._gc_started
            self._gc_started = None
            self.gc.add(took)
            if took > LOG_ABOVE / 2:
                log.warning(
                    "full garbage collection took %.0f ms (%d collected)",
                    took * 1000,
                    info.get("collected", 0),
                )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + PERIOD
            self.sampler.beat()
            await asyncio.sleep(PERIOD)
            self.sampler.beat()
            lag = max(0.0, loop.time() - expected)
            self.current = lag
            self.lag.add(lag)
            held = self.sampler.take()
            if lag > LOG_ABOVE:
                if held:
                    where, count = held[0]
                    log.warning(
                        "event loop ran %.0f ms late; held in (%d of %d samples): %s",
                        lag * 1000,
                        count,
                        sum(n for _, n in held),
                        where,
                    )
                else:
                    log.warning("event loop ran %.0f ms late", lag * 1000)
            if self.on_lag is not None:
                self.on_lag(lag)

    def describe(self) -> dict[str, Any]:
        return {"lag": self.lag.describe(), "full_gc": self.gc.describe()}
