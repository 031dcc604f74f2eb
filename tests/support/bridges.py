"""A shovel runner driven from a test: its own event loop in a thread, while the test
drives pika clients and broker processes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from brokerd.bridges.definitions import parse_shovel
from brokerd.bridges.runner import ShovelRunner


class Running:
    """A ShovelRunner on its own event loop in a thread (the test drives pika meanwhile)."""

    def __init__(self, definition: dict[str, Any], name: str = "s") -> None:
        self.runner = ShovelRunner(parse_shovel(name, definition), node="rookery@test")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.loop.run_until_complete(self.runner.run())

    def status(self) -> dict[str, Any]:
        return self.runner.status()

    def wait(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"{what}: not within {timeout}s; status {self.status()}")

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.runner.stop)
        self.thread.join(15)
        assert not self.thread.is_alive(), "the shovel did not stop"
