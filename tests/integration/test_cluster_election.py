"""Cluster identity details with real processes: host aliases and dumps, and
cluster commands on a standalone broker. Formation, failover, partitions and
refusals are in test_cluster_membership.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokerd_process import BrokerProcess
from tests.cluster_support import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator:
    made: list[Cluster] = []

    def factory(primaries: int = 3, secondaries: int = 0, **kw) -> Cluster:
        cluster = Cluster(tmp_path / f"c{len(made)}", primaries, secondaries, **kw)
        cluster.root.mkdir(parents=True, exist_ok=True)
        made.append(cluster)
        return cluster

    # Cluster writes its file in __init__, so the directory must exist first
    original = Cluster.__init__

    def init(self: Cluster, root: Path, *a, **kw) -> None:
        root.mkdir(parents=True, exist_ok=True)
        original(self, root, *a, **kw)

    Cluster.__init__ = init  # type: ignore[method-assign]
    try:
        yield factory
    finally:
        Cluster.__init__ = original  # type: ignore[method-assign]
        for cluster in made:
            cluster.stop()


def test_standalone_broker_ignores_cluster_commands(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "solo").start()
    try:
        from brokerd.server.control import request

        reply = request(proc.data_dir, "fault", ["heal"])
        assert not reply["ok"] and "clustered broker" in reply["error"]
    finally:
        proc.stop()


def test_aliases_collapse_by_spid_and_dumps_show_the_cluster_view(make_cluster) -> None:
    cluster = make_cluster(3, 0)
    # the first server is listed twice, under two names
    text = cluster.file.read_text().replace(
        "known_hosts = [", f'known_hosts = ["localhost:{cluster.ports[0]}", '
    )
    cluster.file.write_text(text)
    cluster.start_all()
    root = cluster.wait(cluster.agreed_root)
    first = cluster.status(0)
    assert root == first["spid"]
    # on the first server both names led to itself: one is kept as 'self'
    assert "self" in first["links"].values()
    peer = next(p for p in cluster.status(1)["peers"] if p["spid"] == first["spid"])
    assert {f"127.0.0.1:{cluster.ports[0]}", f"localhost:{cluster.ports[0]}"} <= set(
        peer["aliases"]
    )
    assert "duplicate" in cluster.status(1)["links"].values()
    assert len(cluster.status(1)["peers"]) == 2  # two peers, not three
    # the server listed twice counts once in the quorum's denominator
    assert cluster.wait(lambda: cluster.status(1)["known_primaries"] == 3)
    assert first["known_primaries"] == 3
    server = cluster.servers[1]
    server.signal(signal.SIGUSR2)
    server.signal(signal.SIGUSR1)
    cluster.wait(lambda: "=== end of dump ===" in server.log_text())
    log = server.log_text()
    line = next(x for x in log.splitlines() if " status spid=" in x)
    assert f"root={root}" in line and "peers=2/2" in line and "role=primary" in line
    assert f"checksum={first['checksum']}" in line
    assert "cluster: {" in log and "'peers_active': 2" in log
