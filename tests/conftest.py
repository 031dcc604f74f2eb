"""Shared fixtures: real brokerd processes on free loopback ports."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerd_process import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One brokerd per test module (guest/guest, loopback); its log is shown on failure."""
    proc = BrokerProcess(Path(tmp_path_factory.mktemp("brokerd"))).start()
    try:
        yield proc
    finally:
        code = proc.stop()
        if code not in (0, None):
            print(proc.log_text()[-5000:])


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A brokerd of the test's own, for tests that signal or break it."""
    proc = BrokerProcess(tmp_path / "brokerd").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def amqp_port(broker: BrokerProcess) -> int:
    """The module broker's port, or ROOKERY_REFERENCE_AMQP_PORT to run the same
    client tests against a real RabbitMQ."""
    return int(os.environ.get("ROOKERY_REFERENCE_AMQP_PORT") or broker.port)


def uid(prefix: str) -> str:
    """A unique resource name, so tests sharing a broker never collide."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
