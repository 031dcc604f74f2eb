"""Fixtures the integration tests share: clusters made to measure
(``make_cluster``), and the aio-pika connections of ``test_aiopika_client``
and ``test_ttl_dlx_aiopika``, which run against a standalone brokerd and
through a cluster (``amqp_port`` in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aio_pika.abc import AbstractRobustConnection

from tests.cluster_harness import Cluster, MakeCluster
from tests.support.aio import robust_connection


@pytest.fixture(scope="module")
def amqp_url(amqp_port: int) -> str:
    """aio-pika's form of the URL (a module may override it with its client's form)."""
    return f"amqp://guest:guest@127.0.0.1:{amqp_port}/"


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    async for conn in robust_connection(amqp_url):
        yield conn


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """Clusters under tmp_path, made by the test (``make_cluster(3, 1, timeout=2)``);
    every process is resumed and stopped at the end."""
    made: list[Cluster] = []

    def factory(primaries: int = 3, secondaries: int = 0, **kw: object) -> Cluster:
        cluster = Cluster(tmp_path / f"c{len(made)}", primaries, secondaries, **kw)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster

    try:
        yield factory
    finally:
        for cluster in made:
            cluster.close()
