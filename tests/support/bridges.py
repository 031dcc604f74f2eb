"""A shovel runner driven from a test: its own event loop in a thread, while the test
drives pika clients and broker processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from brokerd.bridges.definitions import parse_shovel
from brokerd.bridges.runner import ShovelRunner
from tests.brokerd_process import BrokerProcess


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


@contextlib.contextmanager
def two_brokers(
    base: Path, first: str, second: str
) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """Two standalone brokerd under ``base`` (the two ends of a bridge), stopped after;
    one that did not stop cleanly prints its log's tail."""
    one = BrokerProcess(base / first).start()
    two = BrokerProcess(base / second).start()
    try:
        yield one, two
    finally:
        for proc in (one, two):
            if proc.stop() not in (0, None):
                print(proc.log_text()[-4000:])


def eventually(
    check: Callable[[], bool], timeout: float, what: str, show: Callable[[], Any]
) -> None:
    """Wait until ``check()``; else fail with ``what`` and what ``show()`` says then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout}s; {show()}")


def ctl_json(proc: BrokerProcess, *args: str) -> dict[str, Any]:
    """``brokerd ctl ARGS`` on ``proc``'s data directory: its JSON answer (it must
    succeed)."""
    out = subprocess.run(
        [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(proc.data_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return dict(json.loads(out.stdout))
