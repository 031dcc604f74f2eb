"""The cluster controller's decisions, driven without sockets (fake clock and connections)."""

from __future__ import annotations

from typing import Any

import pytest

from brokerd.cluster import messages
from brokerd.cluster.config import parse_cluster_config
from brokerd.cluster.controller import ClusterController
from brokerd.cluster.link import Link
from brokerd.cluster.messages import LINK_PROPERTY, Status
from brokerd.cluster.wiring.entries import encode_bucket
from brokerd.model.errors import AMQPError, ChannelError
from brokerd.protocol.hooks import Wait
from tests.support.fakes import Clock, Conn, User, VHost

CONFIG = parse_cluster_config(
    {
        "secret": "cluster-secret",
        "known_hosts": ["h1:1", "h2:2", "h3:3"],
        "heartbeat": {"interval": 1, "timeout": 3, "open_timeout": 7},
    }
)


def make(
    spid: str = "s1", start: float = 1.0, server_type: str = "primary"
) -> tuple[ClusterController, Clock]:
    clock = Clock()
    ctl = ClusterController(
        CONFIG, spid=spid, server_type=server_type, start_time=start, address="h1:1", clock=clock
    )
    ctl.standing.started = clock.now - 10  # past the start-up grace
    ctl.listed = True
    return ctl, clock


def link_from(ctl: ClusterController, conn_id: int, spid: str, start: float, **extra: Any) -> None:
    props = {
        "spid": spid,
        "type": "primary",
        "callback": "",
        "start_time": start,
        "checksum": ctl.checksum,
        **extra,
    }
    conn = Conn(conn_id, User("cluster"), client_properties={LINK_PROPERTY: props})
    assert ctl.admit(conn) is None


def status(ctl: ClusterController, conn_id: int, spid: str, start: float, **kw: Any) -> None:
    """Deliver a status; a peer heard for the first time counts as settled (as if it
    had been heard for a while), so tests can focus on votes. Unless ``echo`` is
    given, the peer echoes a status the controller sends just now (it heard us)."""
    explicit_echo = "echo" in kw
    if not explicit_echo:
        kw["echo"] = {ctl.spid: (ctl.status_message().sent_at, 0.0)}
    fields = {
        "type": "primary",
        "checksum": ctl.checksum,
        "root_enabled": True,
        "vote": None,
        "is_root": False,
        "listed": True,
        "address": "",
    }
    fields.update(kw)
    kind, body = messages.encode(Status(spid=spid, start_time=start, **fields))
    ctl.receive(conn_id, kind, body)
    peer = ctl.peers[spid]
    if peer.active_since == ctl.clock():
        peer.active_since -= CONFIG.heartbeat_timeout
        ctl.evaluate()
    term = ctl.standing.term
    if kw.get("vote") == ctl.spid and "term" not in kw and term.backs == ctl.spid:
        # it votes for us and hears the term we claimed: it backs us in it, and says so
        back = {**kw, "term": term.number, "term_for": ctl.spid}
        if not explicit_echo:
            back["echo"] = {ctl.spid: (ctl.status_message().sent_at, 0.0)}
        if peer.status is None or (peer.status.term, peer.status.term_for) != (
            term.number,
            ctl.spid,
        ):
            status(ctl, conn_id, spid, start, **back)


def test_most_senior_becomes_root_once_every_active_primary_votes_for_it() -> None:
    ctl, _clock = make("s1", 1.0)
    link_from(ctl, 11, "s2", 2.0)
    status(ctl, 11, "s2", 2.0, vote="s2")  # s2 has not heard of s1 yet
    assert not ctl.decision.is_root and "waiting for votes" in ctl.decision.reason
    status(ctl, 11, "s2", 2.0, vote="s1")
    assert ctl.decision.is_root and ctl.ready
    assert ctl.status()["root"] == "s1"


def test_root_steps_down_when_quorum_is_lost() -> None:
    ctl, clock = make("s1", 1.0)
    link_from(ctl, 11, "s2", 2.0)
    status(ctl, 11, "s2", 2.0, vote="s1")
    assert ctl.decision.is_root
    for _ in range(4):  # s2 falls silent while our heartbeats go on
        clock.now += CONFIG.heartbeat_interval
        ctl.evaluate()
    assert not ctl.decision.is_root and not ctl.ready
    assert "no quorum" in ctl.decision.reason


def test_a_stalled_server_abstains_before_voting_again() -> None:
    ctl, clock = make("s1", 1.0)
    link_from(ctl, 11, "s2", 2.0)
    status(ctl, 11, "s2", 2.0, vote="s1")
    assert ctl.decision.is_root
    clock.now += 5 * CONFIG.heartbeat_timeout  # SIGSTOP: nothing ran for a while
    ctl.evaluate()
    assert ctl.decision.vote is None and not ctl.decision.is_root
    taken = {"term": ctl.standing.term.number + 1, "term_for": "s2"}  # in a later term
    for _ in range(5):  # s2 took over meanwhile; heartbeats go on
        status(ctl, 11, "s2", 2.0, vote="s2", is_root=True, **taken)
        clock.now += CONFIG.heartbeat_interval
    status(ctl, 11, "s2", 2.0, vote="s2", is_root=True, **taken)
    assert ctl.decision.vote == "s2" and ctl.root() == "s2"  # follows, does not steal


def test_clients_wait_without_a_root_and_are_admitted_with_one() -> None:
    ctl, _ = make("s1", 1.0)
    client = Conn(1, User("guest"))
    wait = ctl.admit(client)
    assert isinstance(wait, Wait) and wait.timeout == 7 and "not ready" in wait.reason
    link_from(ctl, 11, "s2", 2.0)
    status(ctl, 11, "s2", 2.0, vote="s1")
    assert ctl.admit(client) is None


def test_link_refusals() -> None:
    ctl, _ = make()
    bad_sum = Conn(
        5, User("cluster"), client_properties={LINK_PROPERTY: {"spid": "sx", "checksum": "other"}}
    )
    with pytest.raises(AMQPError, match="checksum mismatch") as info:
        ctl.admit(bad_sum)
    assert info.value.reply_code == 530 and "config-mismatch" in ctl.alarms
    with pytest.raises(AMQPError, match="cluster user"):
        ctl.admit(Conn(6, User("guest"), client_properties={LINK_PROPERTY: {"spid": "sy"}}))
    with pytest.raises(AMQPError, match="only be used by cluster links"):
        ctl.admit(Conn(7, User("cluster")))
    with pytest.raises(AMQPError, match="serves vhost"):
        ctl.admit(Conn(8, User("guest"), vhost=VHost("/other")))


def test_only_links_may_publish_cluster_messages() -> None:
    ctl, _ = make()
    with pytest.raises(ChannelError) as info:
        ctl.receive(99, messages.STATUS, b"{}")
    assert info.value.reply_code == 403


def test_malformed_or_foreign_version_messages_are_dropped() -> None:
    ctl, _ = make()
    link_from(ctl, 11, "s2", 2.0)
    ctl.receive(11, messages.STATUS, b"not json")
    ctl.receive(11, messages.STATUS, b'{"v": 99, "spid": "s2"}')
    ctl.receive(11, "cluster.unknown", b"{}")
    assert ctl.peers["s2"].status is None


def test_secondary_never_becomes_root_and_cannot_disable() -> None:
    ctl, _ = make("s0", 0.5, server_type="secondary")
    link_from(ctl, 11, "s1", 1.0)
    status(ctl, 11, "s1", 1.0, vote="s1", is_root=True)
    # a root is known, but wiring must come from it before clients are served
    assert not ctl.decision.is_root and not ctl.ready and "synchronising" in ctl.not_ready_reason
    ctl.receive(11, "cluster.sync", encode_bucket({"seq": 0, "entries": []}, []))
    assert ctl.ready and ctl.status()["root"] == "s1" and ctl.wiring.synced_root == "s1"
    with pytest.raises(ValueError):
        ctl.set_root_enabled(False)


def test_fault_injection_is_refused_unless_enabled() -> None:
    ctl, clock = make()
    with pytest.raises(ValueError, match="fault injection is off"):
        ctl.cut_link("s2")
    ctl.fault_injection = True
    link_from(ctl, 11, "s2", 2.0)
    status(ctl, 11, "s2", 2.0, vote="s1")
    assert ctl.decision.is_root
    ctl.cut_link("s2")
    status(ctl, 11, "s2", 2.0, vote="s1")  # dropped while cut, like a real cut
    clock.now += ctl.standing.lease
    ctl.evaluate()
    assert not ctl.decision.is_root  # s2's vote aged past the lease: no quorum
    assert ctl.peers["s2"].last_seen == 100.0
    ctl.heal()
    status(ctl, 11, "s2", 2.0, vote="s1")
    assert ctl.decision.is_root


def test_a_cut_off_root_steps_down_before_its_followers_time_it_out() -> None:
    """The lease: a follower that echoed the root's status sent at t0 heard it then,
    so it cannot time the root out before t0 + timeout; the root stops acting at
    t0 + lease, an interval earlier, and gives the role up an interval after that."""
    root, clock = make()
    link_from(root, 11, "s2", 2.0)
    link_from(root, 12, "s3", 3.0)
    status(root, 11, "s2", 2.0, vote="s1")
    status(root, 12, "s3", 3.0, vote="s1")  # both echo a status the root sent at t0
    t0 = clock.now
    assert root.decision.is_root and root.role_root
    interval, timeout = CONFIG.heartbeat_interval, CONFIG.heartbeat_timeout
    assert root.standing.lease == timeout - interval
    # nothing arrives any more (a cut): the root keeps acting until the lease runs out
    clock.now = t0 + root.standing.lease - 0.01
    assert root.evaluate().is_root
    clock.now = t0 + root.standing.lease
    assert not root.evaluate().is_root and "lease" in root.decision.reason
    assert root.role_root and root.status()["suspended"]  # announced still, acting no more
    assert clock.now < t0 + timeout  # the followers still see it: no other root yet
    clock.now += interval
    root.evaluate()
    assert not root.role_root and root.root() is None


def test_round_trip_time_comes_from_the_echo_of_our_status() -> None:
    ctl, _ = make()
    link_from(ctl, 11, "s2", 2.0)
    sent = ctl.status_message()
    status(ctl, 11, "s2", 2.0, vote="s1", echo={"s1": (sent.sent_at - 0.5, 0.2)})
    rtt = ctl.peers["s2"].rtt_ms
    assert rtt is not None and 290 <= rtt < 1000
    assert ctl.status()["peers"][0]["rtt_ms"] == rtt
    echoed = ctl.status_message().echo
    assert set(echoed) == {"s2"}


def test_reconfigure_applies_heartbeat_timing_and_known_hosts_live() -> None:
    ctl, _ = make()
    ctl.own_addresses.add("h1:1")
    new = parse_cluster_config(
        {
            "secret": "cluster-secret",
            "known_hosts": ["h1:1", "h2:2"],
            "heartbeat": {"interval": 0.5, "timeout": 2, "open_timeout": 7},
        }
    )
    old_checksum = ctl.checksum
    result = ctl.reconfigure(new)
    assert result["applied"] == ["heartbeat", "known_hosts"]
    assert ctl.checksum == new.checksum != old_checksum
    assert ctl.known == {"h1:1", "h2:2"} and ctl.listed
    assert ctl.config.heartbeat_interval == 0.5
    assert ctl.reconfigure(new)["applied"] == []


def test_a_joiner_is_listed_as_soon_as_the_set_naming_its_address_is_taken() -> None:
    """Admitted as h4:4, it is a member (votes, counts itself once) when it takes the
    set that names it, not only once a link of its own comes back to it (before, its
    status said unlisted for as long as that link took)."""
    clock = Clock()
    ctl = ClusterController(
        CONFIG, spid="s4", server_type="primary", start_time=1.0, address="h4:4", clock=clock
    )
    assert not ctl.listed
    ctl.set_known({"h1:1", "h2:2", "h3:3"}, "x")
    assert not ctl.listed, "its address is not in the set"
    ctl.set_known({"h1:1", "h2:2", "h3:3", "h4:4"}, "y")
    assert ctl.listed and "h4:4" in ctl.own_addresses


def test_names_that_led_to_the_same_server_count_once_in_the_quorum() -> None:
    config = parse_cluster_config(
        {
            "secret": "cluster-secret",
            "known_hosts": ["h1:1", "localhost:1", "h2:2", "h2-alias:2", "h3:3"],
            "heartbeat": {"interval": 1, "timeout": 3, "open_timeout": 7},
        }
    )
    clock = Clock()
    ctl = ClusterController(
        config, spid="s1", server_type="primary", start_time=1.0, address="h1:1", clock=clock
    )
    ctl.standing.started = clock.now - 10
    ctl.listed = True
    assert ctl.known_primaries(clock.now) == 5  # nothing resolved yet: every name counts
    ctl.own_addresses |= {"h1:1", "localhost:1"}
    assert ctl.known_primaries(clock.now) == 4
    link_from(ctl, 11, "s2", 2.0)
    status(ctl, 11, "s2", 2.0, vote="s1")
    ctl.peers["s2"].aliases |= {"h2:2", "h2-alias:2"}
    assert ctl.known_primaries(clock.now) == 3
    # with s1 and s2 active, 2 of 3 servers is a quorum (it would not be 2 of 5): s1
    # claims a term, s2 backs it there
    ctl.evaluate()
    status(ctl, 11, "s2", 2.0, vote="s1")
    assert ctl.evaluate().is_root
    # a name claimed by two live servers is ambiguous and merges nothing
    link_from(ctl, 12, "s3", 3.0)
    status(ctl, 12, "s3", 3.0, vote="s1")
    ctl.peers["s3"].aliases |= {"h2-alias:2", "h3:3"}
    assert ctl.known_primaries(clock.now) == 4
    # an inactive peer's names merge nothing either
    clock.now += CONFIG.heartbeat_timeout + 1
    assert ctl.known_primaries(clock.now) == 4  # only this server's own names merge now


def _refused_link(ctl: ClusterController, address: str, *, reached: bool = True) -> None:
    """A link to ``address`` whose latest attempt was refused (never started); with
    ``reached``, one that was up before (its server had started)."""
    link = Link(
        address,
        user="cluster",
        secret="cluster-secret",
        vhost="/",
        identity=dict,
        on_up=lambda _link: None,
        on_down=lambda _link, _why: None,
    )
    link.state, link.refused = "retrying", True
    ctl.links[address] = link
    if reached:
        ctl.reached.add(address)


def _worker(known_hosts: list[str]) -> tuple[ClusterController, Clock]:
    """Worker 0 of a host whose known hosts are ``known_hosts`` (the first is its own)."""
    config = parse_cluster_config(
        {
            "secret": "cluster-secret",
            "known_hosts": known_hosts,
            "heartbeat": {"interval": 1, "timeout": 3, "open_timeout": 7},
        }
    )
    clock = Clock()
    ctl = ClusterController(
        config,
        spid="s1",
        server_type="primary",
        start_time=1.0,
        address=known_hosts[0],
        clock=clock,
    )
    ctl.standing.started = clock.now - 10
    ctl.listed = True
    ctl.own_addresses.add(known_hosts[0])
    return ctl, clock


def test_a_sibling_worker_whose_socket_refuses_leaves_the_quorum_count() -> None:
    """brokerd --workers: a dead worker does not hold its siblings' root hostage,
    and only a Unix socket's refusal counts as death (a TCP port may lie)."""
    sockets = ["unix:/h/worker-0.sock", "unix:/h/worker-1.sock", "unix:/h/worker-2.sock"]
    ctl, clock = _worker([*sockets, "h9:9"])
    assert ctl.known_primaries(clock.now) == 4
    _refused_link(ctl, "h9:9")
    assert ctl.known_primaries(clock.now) == 4  # a refused TCP port proves nothing
    _refused_link(ctl, sockets[2], reached=False)
    assert ctl.known_primaries(clock.now) == 4  # not started yet: it has not ended
    _refused_link(ctl, sockets[2])
    assert ctl.known_primaries(clock.now) == 3
    # the worker of the third socket starts again and links to us: it counts at once
    link_from(ctl, 21, "s3", 3.0, callback=sockets[2])
    assert ctl.known_primaries(clock.now) == 4
    # our own socket never leaves the count, even if a link to it were refused
    _refused_link(ctl, sockets[0])
    assert ctl.known_primaries(clock.now) == 4


def test_the_root_keeps_its_quorum_while_one_restarted_sibling_joins() -> None:
    sockets = ["unix:/h/worker-0.sock", "unix:/h/worker-1.sock"]
    ctl, clock = _worker(sockets)
    _refused_link(ctl, sockets[1])  # worker 1 died
    assert ctl.evaluate().is_root
    # it starts again (a younger spid) and links in: still left out of the count
    link_from(ctl, 31, "s5", 5.0, callback=sockets[1])
    assert ctl.known_primaries(clock.now) == 1
    assert ctl.evaluate().is_root
    # (without the rule it would count 2 with one vote: no quorum, and the root lost)
    # once its status names this root it counts, and votes for it
    status(ctl, 31, "s5", 5.0, vote="s1", root="s1")
    assert ctl.known_primaries(clock.now) == 2
    assert ctl.evaluate().is_root
    # a server that is not root leaves no newcomer out
    ctl.standing.current_root = None
    link_from(ctl, 32, "s6", 6.0, callback=sockets[1])
    assert ctl.known_primaries(clock.now) == 2


def test_a_root_of_an_earlier_term_is_not_recognised_from_its_stale_status() -> None:
    """The livelock's second half (tests/unit/test_election_livelock.py): a server that
    backed a later term took an earlier root's last status, still saying root, for a
    root again, and applied its entries. A root's term must not be below ours."""
    ctl, _clock = make("s1", 1.0)
    link_from(ctl, 11, "s2", 2.0)
    link_from(ctl, 12, "s3", 3.0)
    log = {"state_source": "s3", "state_seq": 10, "state_term": 5}  # the log ranking first
    status(ctl, 12, "s3", 3.0, vote="s3", term=5, term_for="s3", **log)
    status(ctl, 11, "s2", 2.0, vote="s3", term=5, term_for="s3")
    assert ctl.decision.vote == "s3" and ctl.standing.term.number == 5  # it backs s3 in 5
    status(ctl, 11, "s2", 2.0, vote="s2", is_root=True, term=4, term_for="s2")
    assert ctl.root() is None
    status(ctl, 12, "s3", 3.0, vote="s3", is_root=True, term=5, term_for="s3", **log)
    assert ctl.root() == "s3"
