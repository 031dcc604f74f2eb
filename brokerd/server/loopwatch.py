"""How late the event loop runs, and what the garbage collector costs it.

Every control message, every heartbeat and every client waits for the one
event loop; when it falls behind (a burst of work, a full collection over a
deep queue's millions of objects, a starved CPU) everything does. The watch
wakes every ``PERIOD`` and records how late it woke (``lag``), times each
collection of the oldest generation, and tells flow control (``on_lag``), so
that a loop falling behind slows the publishers feeding it instead of
letting statuses age (``brokerd.cluster.plane.flow``, cause ``event-loop``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from brokerd.cluster.latency import LatencyWindow

log = logging.getLogger("brokerd.server.loopwatch")

#: how often the watch wakes (seconds)
PERIOD = 0.05
#: a lag above this is logged (seconds)
LOG_ABOVE = 0.5


class LoopWatch:
    """Samples the loop's lag; times full collections."""

    def __init__(self, on_lag: Callable[[float], None] | None = None) -> None:
        self.on_lag = on_lag
        self.lag = LatencyWindow(1200)  # the last minute
        self.gc = LatencyWindow(64)
        self.current = 0.0
        self._gc_started: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        gc.callbacks.append(self._gc_event)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
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
            await asyncio.sleep(PERIOD)
            lag = max(0.0, loop.time() - expected)
            self.current = lag
            self.lag.add(lag)
            if lag > LOG_ABOVE:
                log.warning("event loop ran %.0f ms late", lag * 1000)
            if self.on_lag is not None:
                self.on_lag(lag)

    def describe(self) -> dict[str, Any]:
        return {"lag": self.lag.describe(), "full_gc": self.gc.describe()}
