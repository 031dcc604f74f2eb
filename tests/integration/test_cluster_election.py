"""Cluster identity details with real processes: host aliases and dumps, and
cluster commands on a standalone broker. Formation, failover, partitions and
refusals are in test_cluster_membership.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.brokerd_process import BrokerProcess
from tests.cluster_harness import MakeCluster

pytestmark = pytest.mark.integration


def test_standalone_broker_ignores_cluster_commands(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "solo").start()
    try:
        from brokerd.server.control import request

        reply = request(proc.data_dir, "fault", ["heal"])
        assert not reply["ok"] and "clustered broker" in reply["error"]
    finally:
        proc.stop()


def test_aliases_collapse_by_spid_and_dumps_show_the_cluster_view(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 0)
    # one server (the first listed) is listed twice, under two names
    port = cluster.primary_ports[0]
    text = cluster.file.read_text().replace(
        "known_hosts = [", f'known_hosts = ["localhost:{port}", '
    )
    cluster.file.write_text(text)
    cluster.start_all()
    twice = cluster.ports.index(port)
    root = cluster.wait_until(cluster.agreed_root)
    # start_all renumbers by seniority, so the server listed twice is not always
    # index 0: the dump is read on a primary that is neither it nor the root
    other = next(i for i in range(3) if i != twice and cluster.spid(i) != root)
    first, second = cluster.status(twice), cluster.status(other)
    assert first is not None and second is not None
    assert root == cluster.spid(0)  # the eldest, however it is listed
    # on the server listed twice both names led to itself: one is kept as 'self'
    assert "self" in first["links"].values()
    peer = next(p for p in second["peers"] if p["spid"] == first["spid"])
    assert {f"127.0.0.1:{port}", f"localhost:{port}"} <= set(peer["aliases"])
    assert "duplicate" in second["links"].values()
    assert len(second["peers"]) == 2  # two peers, not three
    # the server listed twice counts once in the quorum's denominator
    assert cluster.wait_until(lambda: (cluster.status(other) or {}).get("known_primaries") == 3)
    assert first["known_primaries"] == 3
    server = cluster.nodes[other].process
    assert server is not None
    server.signal(signal.SIGUSR2)
    server.signal(signal.SIGUSR1)
    cluster.wait_until(lambda: "=== end of dump ===" in server.log_text())
    log = server.log_text()
    line = next(x for x in log.splitlines() if " status spid=" in x)
    assert f"root={root}" in line and "peers=2/2" in line and "role=primary" in line
    assert f"checksum={first['checksum']}" in line
    assert "cluster: {" in log and "'peers_active': 2" in log
