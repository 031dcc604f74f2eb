"""Lane probes over real links (``brokerd/cluster/probes.py``): every link carrying
messages probes its data lane each heartbeat and the peers echo, so a healthy
cluster owes no echoes for long and never rebuilds a link for it."""

from __future__ import annotations

import time

import pytest

from brokerd.cluster.probes import stall_after
from brokerd.server.control import request
from tests.cluster_harness import TIMEOUT, MakeCluster

pytestmark = [pytest.mark.integration]


def _dump(cluster: object, index: int) -> list[str]:
    reply = request(cluster.nodes[index].data_dir, "dump", timeout=5)  # type: ignore[attr-defined]
    return list(reply["result"]["dump"].splitlines())


def _link_lines(cluster: object, index: int) -> list[str]:
    return [line for line in _dump(cluster, index) if line.startswith("  link ")]


def test_a_healthy_cluster_echoes_every_probe_and_rebuilds_no_link(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 1)
    cluster.start_all()
    cluster.wait_until(cluster.settled_root, timeout=15, what="formation")
    time.sleep(stall_after(TIMEOUT) + 1.0)  # past the bound a stalled lane is dropped at
    for index in range(4):
        lines = _link_lines(cluster, index)
        assert len(lines) == 3, lines  # one link to each other server
        for line in lines:
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            assert int(fields["probes"]) >= 5, line  # one a heartbeat, for seconds now
            assert int(fields["probes_owed"]) <= 2, line  # echoed within a beat or two
        # every inbound link connection is known as a peer's lane, and is being read
        inbound = [line for line in _dump(cluster, index) if "user=cluster" in line]
        lanes = sorted(line.split("link_of=")[1].split("/")[1] for line in inbound)
        assert lanes == ["control"] * 3 + ["data"] * 3, inbound
        assert not any("reading=stopped" in line for line in inbound), inbound
    for node in cluster.nodes:
        log = node.process.log_text()  # type: ignore[union-attr]
        assert "link stalled" not in log, log[-3000:]
