"""Shared fixtures: real brokerd processes on free loopback ports."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerd_process import BrokerProcess

#: test directories whose every test starts real processes (brokers, browsers, a console)
PROCESS_DIRS = ("integration", "browser", "faults")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``integration`` marker for every test that starts processes, so that
    ``make test-fast`` (``-m "not integration"``) runs the unit tests alone:
    everything under ``PROCESS_DIRS``, and the pipeline tests that take a real
    Spark session."""
    root = Path(__file__).parent
    for item in items:
        parts = Path(item.fspath).relative_to(root).parts
        spark = parts[0] == "pipeline" and "spark" in getattr(item, "fixturenames", ())
        if parts[0] in PROCESS_DIRS or spark:
            item.add_marker(pytest.mark.integration)


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


@pytest.fixture(scope="module", params=["standalone", "cluster"])
def amqp_port(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """Where the client test modules connect, each run twice: to a standalone
    brokerd, and to a non-root primary of a running three-primary cluster (so
    every shared queue they use is mastered on another server).
    ROOKERY_REFERENCE_AMQP_PORT runs them once against a real RabbitMQ instead."""
    reference = os.environ.get("ROOKERY_REFERENCE_AMQP_PORT")
    if reference:
        if request.param == "cluster":
            pytest.skip("the reference broker runs the standalone variant only")
        yield int(reference)
        return
    if request.param == "standalone":
        yield request.getfixturevalue("broker").port
        return
    from tests.cluster_harness import Cluster

    cluster = Cluster(tmp_path_factory.mktemp("cluster"), primaries=3, interval=0.5, timeout=2.5)
    try:
        root = cluster.start_settled()
        yield cluster.nodes[cluster.followers(root)[0]].port
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.close()


def uid(prefix: str) -> str:
    """A unique resource name, so tests sharing a broker never collide."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
