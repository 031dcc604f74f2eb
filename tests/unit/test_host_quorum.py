"""In a cluster of hosts (``brokerd --workers N --cluster FILE``) the quorum counts hosts.

Every host runs the same number of workers W (the count is in the checksum, so
a host started with another is refused), and a worker's election counts the
known hosts times W (``Standing.known_primaries``). The property below shows
that this is a vote of hosts: for any hosts, workers and set of backing workers,
the election's quorum holds exactly when the backing weighs more than half of
the hosts with each worker weighing 1/W of its host, so no host, whatever its
workers, outvotes the rest. Placement takes other hosts first for a quorum
queue's group, so a host that fails takes one copy.
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.config import ClusterConfig, HostPort
from brokerd.cluster.election import Member, View, has_quorum
from brokerd.cluster.hostgroup import HostGroup, known_hosts_count
from brokerd.cluster.membership import Membership
from brokerd.cluster.messages import Status
from brokerd.cluster.ownership.rules import QUORUM, group_of
from tests.support.examples import examples


def _quorum(backers: list[tuple[int, int]], hosts: int, workers: int) -> bool:
    """The election's quorum for these (host, worker) backers, over H*W known primaries."""
    members = [Member(spid=f"h{h}w{w}", vote="x") for h, w in sorted(set(backers))]
    view = View(me=members[0], peers=tuple(members[1:]), known_primaries=hosts * workers)
    return has_quorum(view)


def _host_weight_majority(backers: list[tuple[int, int]], hosts: int, workers: int) -> bool:
    weight = sum((Fraction(1, workers) for _ in set(backers)), Fraction(0))
    return 2 * weight > hosts


@st.composite
def _cluster(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, int]]]:
    hosts = draw(st.integers(min_value=1, max_value=5))
    workers = draw(st.integers(min_value=1, max_value=6))
    every = [(h, w) for h in range(hosts) for w in range(workers)]
    backers = draw(st.lists(st.sampled_from(every), min_size=1, unique=True))
    return hosts, workers, backers


@settings(max_examples=examples(500))
@given(_cluster())
def test_the_quorum_is_a_majority_of_hosts(cluster: tuple[int, int, list[tuple[int, int]]]) -> None:
    hosts, workers, backers = cluster
    assert _quorum(backers, hosts, workers) == _host_weight_majority(backers, hosts, workers)


@settings(max_examples=examples(200))
@given(st.integers(min_value=2, max_value=5), st.integers(min_value=1, max_value=64))
def test_one_host_never_outvotes_the_rest(hosts: int, workers: int) -> None:
    every_worker_of_one_host = [(0, w) for w in range(workers)]
    assert not _quorum(every_worker_of_one_host, hosts, workers)


def test_a_host_with_another_worker_count_has_another_checksum() -> None:
    """Hosts that run different counts are refused by the checksum (config-mismatch):
    8 workers against 2 and 2 would otherwise hold 8 of 12 votes."""
    hosts = (HostPort("a", 5672), HostPort("b", 5672), HostPort("c", 5672))
    base = ClusterConfig("c", "/", "s", "cluster", hosts)
    two = ClusterConfig("c", "/", "s", "cluster", hosts, host_workers=2)
    eight = ClusterConfig("c", "/", "s", "cluster", hosts, host_workers=8)
    assert len({base.checksum, two.checksum, eight.checksum}) == 3
    assert two.checksum == ClusterConfig("c", "/", "s", "cluster", hosts, host_workers=2).checksum


def test_known_hosts_merge_by_the_host_their_names_reached() -> None:
    known = {"a:1", "a-alias:1", "b:1", "c:1"}
    # both of our names reached this host; b's name reached host B's workers
    assert known_hosts_count(known, {"a:1", "a-alias:1"}, {"B": {"b:1"}}) == 3
    # a name nothing has resolved yet counts on its own (never fewer hosts than there are)
    assert known_hosts_count(known, {"a:1"}, {}) == 4
    # a name two hosts claim merges nothing
    assert known_hosts_count({"a:1", "x:1", "b:1"}, {"a:1", "x:1"}, {"B": {"x:1", "b:1"}}) == 3


def _membership() -> Membership:
    hosts = (HostPort("a", 1), HostPort("b", 1), HostPort("c", 1))
    config = ClusterConfig("c", "/", "s", "cluster", hosts, host_workers=2)
    members = Membership(
        config, spid="s-a0", server_type="primary", start_time=1.0, address="a:9000"
    )
    members.hostgroup = HostGroup(
        host_id="A",
        host_address="a:1",
        index=0,
        sockets=("unix:/h/worker-0.sock", "unix:/h/worker-1.sock"),
        links=("a:9000", "a:9001"),
    )
    members.own_addresses.add("a:1")
    return members


def _heard(members: Membership, spid: str, host: str, aliases: set[str], now: float) -> None:
    peer = members._peer(spid)
    peer.aliases |= aliases
    peer.status = Status(
        spid=spid,
        type="primary",
        start_time=1.0,
        checksum=members.checksum,
        root_enabled=True,
        vote=None,
        is_root=False,
        listed=True,
        address=next(iter(aliases)),
        host=host,
    )
    peer.last_seen = now


def test_a_worker_counts_hosts_times_their_workers() -> None:
    members = _membership()
    now = members.clock()
    _heard(members, "s-a1", "A", {"a:9001"}, now)
    _heard(members, "s-b0", "B", {"b:1", "b:9000"}, now)
    _heard(members, "s-b1", "B", {"b:9001"}, now)
    assert members.known_primaries(now) == 3 * 2
    # a second name for host A (listed in the file) that a sibling was reached at
    members.known.add("a2:1")
    assert members.known_primaries(now) == 4 * 2  # not resolved yet: counts on its own
    members.peers["s-a1"].aliases.add("a2:1")
    assert members.known_primaries(now) == 3 * 2


def test_quorum_groups_take_other_hosts_first() -> None:
    hosts = {"a0": "A", "a1": "A", "a2": "A", "b0": "B", "b1": "B", "c0": "C", "c1": "C"}
    primaries = ["a0", "a1", "a2", "b0", "b1", "c0", "c1"]
    group = group_of(QUORUM, {}, "a0", primaries, len(primaries), {}, hosts)
    assert group is not None and group[0] == "a0"
    assert {hosts[a] for a in group} == {"A", "B", "C"}
    # five members over three hosts: no host holds a majority of the group
    five = group_of(QUORUM, {"x-quorum-initial-group-size": 5}, "a0", primaries, 7, {}, hosts)
    assert five is not None and len(five) == 5
    for host in "ABC":
        assert 2 * sum(hosts[a] == host for a in five) < 5
    # servers of their own (no hosts given): as before, fewest groups then seniority
    assert group_of(QUORUM, {}, "a0", primaries, 7, {"a1": 1}) == ("a0", "a2", "b0")
