"""Membership forgets earlier runs of restarted servers (issue 43: restarts must not
grow state), but never one that something still names."""

from __future__ import annotations

from types import SimpleNamespace

from brokerd.cluster.linking import FORGET_AFTER
from brokerd.cluster.peers import Peer
from tests.unit.test_cluster_controller import CONFIG, make

BOUND = FORGET_AFTER * CONFIG.heartbeat_timeout


def runs(ctl, address: str, *spids: str, heard: float) -> list[Peer]:  # type: ignore[no-untyped-def]
    """Records of successive runs of the server at ``address``, each last heard at
    ``heard`` (the last one: now)."""
    made = []
    for spid in spids:
        peer = ctl.peers[spid] = Peer(spid, address=address, last_seen=heard)
        made.append(peer)
    made[-1].last_seen = ctl.clock()
    return made


def test_earlier_runs_silent_past_the_bound_are_forgotten_the_newest_never() -> None:
    ctl, clock = make()
    now = clock()
    runs(ctl, "h2:1", "a1", "a2", "a3", heard=now - BOUND - 1)
    runs(ctl, "h3:1", "b1", heard=now - 10 * BOUND)  # one run: never forgotten
    assert sorted(ctl.forget_superseded(now)) == ["a1", "a2"]
    assert sorted(ctl.peers) == ["a3", "b1"]
    assert ctl.forget_superseded(now) == []


def test_a_run_heard_lately_linked_or_named_stays() -> None:
    ctl, clock = make()
    now = clock()
    old, _new = runs(ctl, "h2:1", "a1", "a2", heard=now - BOUND + 1)
    assert ctl.forget_superseded(now) == []  # heard within the bound
    old.last_seen = now - BOUND - 1
    old.inbound.add(7)  # a connection of its still open
    assert ctl.forget_superseded(now) == []
    old.inbound.clear()
    # a queue still names it as owner (its failover, or its return, reads the record)
    ctl.queues.shared_queues = lambda: [SimpleNamespace(owner="a1")]  # type: ignore[method-assign]
    assert ctl.forget_superseded(now) == []
    ctl.queues.shared_queues = lambda: [SimpleNamespace(owner="a2")]  # type: ignore[method-assign]
    ctl.queues.copies.pending = {"a1"}  # fenced, its queues not all placed elsewhere
    assert ctl.forget_superseded(now) == []
    ctl.queues.copies.pending = set()
    ctl.bridges.placed[("/", "b")] = ("a1", 1)  # a bridge placed on it
    assert ctl.forget_superseded(now) == []
    ctl.bridges.placed.clear()
    assert ctl.forget_superseded(now) == ["a1"]


def test_a_forgotten_servers_records_go_too_its_last_run_included() -> None:
    ctl, clock = make()
    now = clock()
    runs(ctl, "h9:1", "f1", heard=now)
    ctl.peers["f1"].last_seen = now - BOUND - 1  # its one run, stopped long ago
    runs(ctl, "h8:1", "g1", heard=now)
    ctl.peers["g1"].last_seen = now - BOUND - 1  # silent, but still a member
    ctl.known = {*ctl.known, "h8:1"}
    assert ctl.forget_superseded(now) == []  # not forgotten yet: its last run stays
    ctl.members_record = {"forgotten": [["h9:1", "node"]]}
    assert ctl.forget_superseded(now) == ["f1"]
    assert "g1" in ctl.peers
