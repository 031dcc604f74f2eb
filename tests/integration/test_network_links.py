"""Cluster links on a real network (tests/support/netbed.py; issue 41).

A server whose cable is pulled sends no FIN and no RST: every connection with
it stays open on the other servers, and the kernel keeps accepting writes into
it. Only silence says it is gone. Each link lane asks for an AMQP heartbeat of
twice the cluster's heartbeat timeout (``link.link_heartbeat``): the other
servers close the lanes it opened within two heartbeats and their own lanes to
it within three, instead of the two to three minutes the default 60 s heartbeat
took; and once it is plugged in again the links come back and it rejoins.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.cluster.link import link_heartbeat
from tests.cluster_harness import Cluster, netbed_cluster
from tests.support.netbed import unavailable

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(unavailable() is not None, reason=f"netbed: {unavailable()}"),
]

TIMEOUT = 1.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with netbed_cluster(tmp_path, 3, TIMEOUT) as made:
        yield made


def _link_state(cluster: Cluster, index: int, peer: str) -> str | None:
    view = cluster.status(index) or {}
    for p in view.get("peers", []):
        if p.get("spid") == peer:
            return p.get("link")
    return None


def test_an_unplugged_servers_links_are_closed_in_seconds_and_come_back(cluster: Cluster) -> None:
    bed = cluster.netbed
    assert bed is not None
    gone = 2
    spid = cluster.spid(gone)
    assert _link_state(cluster, 0, spid) == "up"
    heartbeat = link_heartbeat(TIMEOUT)
    bed.unplug(cluster.nodes[gone].bed_slot)  # type: ignore[arg-type]
    unplugged = time.monotonic()
    try:
        # our lanes to it: aiormq gives up after three silent heartbeats (plus one)
        bound = 3 * (heartbeat + 1) + 3
        cluster.wait_until(
            lambda: _link_state(cluster, 0, spid) not in ("up", None),
            timeout=bound,
            what=f"server 0's link to the unplugged server down within {bound}s",
        )
        took = time.monotonic() - unplugged
        # the lanes it opened to us: closed after two silent heartbeats
        log = cluster.nodes[0].process.log_text()  # type: ignore[union-attr]
        assert "missed heartbeats" in log, log[-3000:]
        # the two others keep a root meanwhile
        cluster.wait_until(
            lambda: cluster.settled_root([0, 1]), timeout=15, what="a root of the other two"
        )
    finally:
        bed.heal()
    cluster.wait_until(
        lambda: _link_state(cluster, 0, spid) == "up", timeout=30, what="the link back up"
    )
    cluster.wait_until(cluster.settled_root, timeout=30, what="all three under one root")
    assert took < bound
