"""Shared fixtures: real brokerd processes on free loopback ports."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.brokerd_process import BrokerProcess

#: test directories whose every test starts real processes (brokers, browsers, a console)
PROCESS_DIRS = ("integration", "browser", "faults")
#: the tests that share the session's Spark (tests/pipeline/conftest.py)
PIPELINE = "tests/pipeline/"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``integration`` marker for every test that starts processes, so that
    ``make test-fast`` (``-m "not integration"``) runs the unit tests alone:
    everything under ``PROCESS_DIRS``, and the pipeline tests that take a real
    Spark session. And ``tests/pipeline`` first: ``make test``'s longest unit
    of work (see ``pytest_xdist_make_scheduler``) starts early instead of
    leaving one worker busy at the end. (Every long module first was slower: the
    long modules mostly wait, and the unit modules' computing fills that wait
    only when the two run together.)"""
    root = Path(__file__).parent
    for item in items:
        parts = Path(item.fspath).relative_to(root).parts
        spark = parts[0] == "pipeline" and "spark" in getattr(item, "fixturenames", ())
        if parts[0] in PROCESS_DIRS or spark:
            item.add_marker(pytest.mark.integration)
        _name_the_operation(item)
    items.sort(key=lambda item: not item.nodeid.startswith(PIPELINE))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _refuse_shared_ids(items)


def _name_the_operation(item: pytest.Item) -> None:
    """One id per API operation for schemathesis's tests. Its items pass their bare
    function name as ``originalname``, from which pytest 9 builds the id, so every
    operation's test had the same one, and xdist (which schedules by id) would run
    only the first. The operation's label goes in the id's brackets, where
    parametrization puts it."""
    label = getattr(item, "operation_label", None)
    if label is None or item.id.params is not None:
        return
    item._id = item.id.with_params(label)  # type: ignore[attr-defined]


def _refuse_shared_ids(items: list[pytest.Item]) -> None:
    """xdist schedules by test id: of several tests with one id (schemathesis gives
    all the operations of a schema one) it would run one alone, silently. The one it
    runs fails instead, saying why."""
    first: dict[str, pytest.Item] = {}
    for item in items:
        if item.nodeid not in first:
            first[item.nodeid] = item
            continue

        def refuse(nodeid: str = item.nodeid) -> None:
            pytest.fail(
                f"{nodeid}: several tests share this id, and xdist would run one of them;"
                " give each its own (see _name_the_operation)"
            )

        first[item.nodeid].runtest = refuse  # type: ignore[method-assign]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (``make test``), with ``tests/pipeline`` as one file.

    A module's tests stay on one worker, so module-scoped brokers and clusters
    start once; the pipeline's modules share the session's Spark
    (tests/pipeline/conftest.py), which takes most of a minute to start and
    feed, so they share a worker too. (xdist's ``loadgroup`` would do this
    with marks, but it renames test ids in a way pytest 9 no longer sees.)
    """
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class PipelineTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return PIPELINE if nodeid.startswith(PIPELINE) else super()._split_scope(nodeid)

    return PipelineTogether(config, log)


#: fixtures of unit directories whose process is shared by the tests of the session
#: (``tests/pipeline``'s Spark; those of ``PROCESS_DIRS`` are marked anyway): a test that
#: uses one needs the ``integration`` marker even when an earlier test already started
#: the process (``make test``), or it fails alone (``make test-fast``)
PROCESS_FIXTURES = frozenset({"spark"})


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test without the ``integration`` marker that starts a process fails, and so
    does one that uses a fixture sharing a process (``PROCESS_FIXTURES``, also when
    it asks for it by name at run time): ``make test-fast`` stays a loop of unit
    tests, and ``make test`` (where the shared process is up already) says so too."""
    if request.node.get_closest_marker("integration") is not None:
        yield
        return

    def refuse(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a process ({args!r}): mark it integration"
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        yield
    used = PROCESS_FIXTURES.intersection(request.fixturenames)
    if used:
        pytest.fail(
            f"{request.node.nodeid} uses {', '.join(sorted(used))} (a shared process):"
            " mark it integration"
        )


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
