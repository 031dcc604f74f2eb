"""Election timing with real Membership objects on a simulated network
(``membership_net``): failover in round trips once a peer is gone, pauses the
followers never notice, hand-over without a gap, detachment on a cut link.
Heartbeat interval 1 s, timeout 3 s (the defaults); link delays up to 20 ms.
Every test also checks, after every event, that at most one server would act
as root."""

from __future__ import annotations

import pytest

from brokerd.model.errors import AMQPError
from tests.support.fakes import Conn, User
from tests.unit.membership_net import Net, conn_id

INTERVAL, TIMEOUT = 1.0, 3.0


def formed(seed: int = 1) -> Net:
    net = Net(3, seed=seed)
    net.run(6)
    assert net.root() == 0 and all(n.current_root == "s0" for n in net.nodes)
    for node in net.nodes:
        node.root_changes.clear()
    return net


def test_kill_9_of_the_root_elects_the_next_in_a_few_round_trips() -> None:
    net = formed()
    net.run(0.37)  # somewhere between beats
    net.kill(0)
    took = net.run_until(lambda: net.root() == 1, limit=1.0)
    assert took < 0.2, took  # gone at once, votes sent on change: round trips, not a timeout
    net.run_until(lambda: net.nodes[2].current_root == "s1", limit=0.2)
    assert [new for _, _, new in net.nodes[2].root_changes] == [None, "s1"]


def test_a_refused_port_alone_is_not_enough_while_a_connection_is_open() -> None:
    net = formed()
    follower = net.nodes[1]
    link = follower.peers["s0"].link
    assert link is not None
    link.state, link.refused = "retrying", True  # our link dropped, reconnecting refused...
    follower._link_down(link, "unreachable")
    assert not follower.peers["s0"].gone  # ...but s0's own link to us is still open
    follower.closed(Conn(conn_id(0, 1), User("cluster")))  # type: ignore[arg-type]
    assert follower.peers["s0"].gone
    # anything it says later comes on a new connection, which brings it back
    follower.admit(net._link_conn(0, 1))  # type: ignore[arg-type]
    assert not follower.peers["s0"].gone


@pytest.mark.parametrize("phase", [0.0, 0.2, 0.45])
@pytest.mark.parametrize("pause", [2.0, 2.4, 2.7, 2.95])
def test_a_root_paused_for_less_than_the_timeout_is_invisible(phase: float, pause: float) -> None:
    """The root beats every half interval and its followers wait the timeout after
    its next beat was due, so they still hear it when it resumes; it reads their
    old votes, whose echoes are old, so it acts again only once they have answered
    its fresh status."""
    net = formed()
    net.run(phase)
    net.pause(0)
    net.run(pause)
    net.resume(0, stale_first=True)  # a client or a timer first, from the stale view
    took = net.run_until(lambda: net.root() == 0, limit=0.5)
    assert took < 0.2
    net.run(5)
    assert net.root() == 0
    assert [n.root_changes for n in net.nodes] == [[], [], []], "followers saw a change"
    assert all(n.current_root == "s0" for n in net.nodes) and net.nodes[0].role_root


def test_a_root_paused_past_the_timeout_is_replaced_and_does_not_come_back() -> None:
    net = formed()
    net.pause(0)
    took = net.run_until(lambda: net.root() == 1, limit=TIMEOUT + 1)
    assert TIMEOUT <= took < TIMEOUT + INTERVAL / 2 + 0.3
    net.run(2)
    net.resume(0, stale_first=True)
    net.run(3 * TIMEOUT)
    assert net.root() == 1 and all(n.current_root == "s1" for n in net.nodes)
    # nobody heard the frozen root, so nobody was told to leave
    assert [n.detaches for n in net.nodes] == [[], [], []]


def test_disabling_root_hands_over_in_a_few_round_trips() -> None:
    net = formed()
    net.run(0.3)
    root = net.nodes[0]
    root.root_enabled = False  # what ``root disable`` does, then it evaluates
    root.evaluate()
    assert not root.role_root
    took = net.run_until(lambda: net.root() == 1, limit=1.0)
    assert took < 0.15, took
    gap = net.run_until(lambda: all(n.current_root == "s1" for n in net.nodes), limit=0.2)
    assert took + gap < 0.2
    net.run(5)
    assert net.root() == 1


def test_a_stopping_root_steps_down_and_its_successor_takes_over_at_once() -> None:
    net = formed()
    net.nodes[0].step_down()
    assert not net.nodes[0].role_root and net.nodes[0].decision.vote is None
    assert net.run_until(lambda: net.root() == 1, limit=1.0) < 0.15


def test_a_server_cut_from_the_root_moves_its_clients_while_the_others_carry_on() -> None:
    net = formed()
    net.cut(0, 2)
    took = net.run_until(lambda: net.nodes[2].detached == "s0", limit=3.0)
    # silent for an interval (counted from its last status, before the cut), and a
    # peer that heard it two beats later
    assert INTERVAL / 2 <= took < 2 * INTERVAL + 0.2, took
    cut_off = net.nodes[2]
    assert len(cut_off.detaches) == 1 and "cannot reach root s0" in cut_off.detaches[0][1]
    assert not cut_off.ready
    with pytest.raises(AMQPError) as info:
        cut_off.admit(Conn(1, User("guest")))  # type: ignore[arg-type]
    assert info.value.reply_code == 320 and "another server" in info.value.text
    net.run(2 * TIMEOUT)
    assert net.root() == 0 and net.nodes[1].ready and net.nodes[1].detached is None
    assert cut_off.detached == "s0"  # for as long as the cut lasts
    net.heal()
    net.run_until(lambda: cut_off.ready and cut_off.detached is None, limit=2 * TIMEOUT)
    assert net.root() == 0 and cut_off.admit(Conn(2, User("guest"))) is None  # type: ignore[arg-type]


def test_answers_never_ask_back_and_are_rate_limited() -> None:
    net = formed()
    root = net.nodes[0]
    sent: list[bool] = []
    original = net.send

    def spy(src: int, dst: int, kind: str, body: bytes) -> None:
        if src == 1 and dst == 0 and kind == "cluster.status":
            sent.append(b'"reply": true' in body)
        original(src, dst, kind, body)

    net.send = spy  # type: ignore[method-assign]
    for _ in range(3):  # three asks in one instant: one answer
        root._send_status_all(net.clock.now, ask=True)
        net.run(0.05)
    assert sent.count(False) == 1 and True not in sent


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_healed_server_hearing_a_witness_before_the_root_does_not_detach(seed: int) -> None:
    """Cut off from both others past the timeout (no root, no witness: partitioned, it
    sends its clients away), then healed: the other follower's status may arrive
    first, naming a root not heard for long. The detach waits half an interval and
    asks; the root answers at once: no second sending away."""
    net = formed(seed)
    net.cut(2, 0)
    net.cut(2, 1)
    net.run(2 * TIMEOUT)
    lonely = net.nodes[2]
    assert lonely.current_root is None and not lonely.ready and lonely.detached is None
    assert [reason for _, reason in lonely.detaches] == [
        f"cluster: {lonely.standing.partition.reason}"
    ]
    net.heal()
    net.nodes[1]._send_status_all(net.clock.now, ask=False)  # the witness speaks first
    net.run_until(lambda: lonely.ready, limit=TIMEOUT)
    assert lonely.current_root == "s0" and len(lonely.detaches) == 1
    assert lonely.standing.partition.reason is None


def test_a_server_cut_off_in_a_minority_sends_its_clients_away_the_majority_serves() -> None:
    """RabbitMQ's pause_minority: cut off from both others, it cannot tell a partition
    from a majority serving without it, so once it has lost its root (the timeout)
    it refuses clients at once with 320 instead of holding them blocked."""
    net = formed()
    net.cut(2, 0)
    net.cut(2, 1)
    lonely = net.nodes[2]
    took = net.run_until(lambda: lonely.standing.partition.reason is not None, limit=2 * TIMEOUT)
    # both others silent past the timeout after their next beat was due, then half an
    # interval of grace
    assert TIMEOUT <= took <= TIMEOUT + 1.5 * INTERVAL + 0.1, took
    assert "partitioned" in lonely.detaches[0][1]
    with pytest.raises(AMQPError) as info:
        lonely.admit(Conn(1, User("guest")))  # type: ignore[arg-type]
    assert info.value.reply_code == 320 and "another server" in info.value.text
    net.run(TIMEOUT)
    assert net.root() == 0 and net.nodes[1].ready
    assert all(n.standing.partition.reason is None for n in net.nodes[:2])
    net.heal()
    net.run_until(lambda: lonely.ready, limit=2 * TIMEOUT)
    assert lonely.standing.partition.reason is None and len(lonely.detaches) == 1
    assert lonely.admit(Conn(2, User("guest"))) is None  # type: ignore[arg-type]


def test_a_restarted_peer_s_earlier_record_does_not_make_its_address_look_ended() -> None:
    """A peer that restarted leaves a record of its earlier process, gone, with the same
    address; the new one may never have answered to the known host's name (a
    duplicate link is not tried again). Only the latest run of a server says
    whether it has ended, so a server cut off after such a restart is still
    partitioned."""
    from dataclasses import replace

    net = formed()
    lonely = net.nodes[2]
    for spid in ("s0", "s1"):
        now = lonely.peers[spid]
        # its callback address differs from the known host's name (a proxy, a DNS
        # name); an earlier process at the same callback address (spids sort by start
        # time) alone answered to the known name
        now.address = f"direct-{spid}:1"
        lonely.peers["r" + spid[1:]] = replace(
            now, spid="r" + spid[1:], aliases={now.address, *now.aliases}, gone=True, link=None
        )
        now.aliases = {now.address}
    net.cut(2, 0)
    net.cut(2, 1)
    net.run_until(lambda: lonely.standing.partition.reason is not None, limit=2 * TIMEOUT)
    assert lonely.ended_primaries(net.clock.now) == 0


def test_a_survivor_of_ended_primaries_holds_its_clients_as_design_md_says() -> None:
    """The two others' processes ended (their ports refuse): no majority can be serving
    anywhere, so the survivor is not partitioned: its clients wait for a root."""
    net = formed()
    net.kill(0)
    net.kill(1)
    net.run(3 * TIMEOUT)
    survivor = net.nodes[2]
    assert survivor.current_root is None and not survivor.ready
    assert survivor.standing.partition.reason is None and survivor.detaches == []
    assert survivor.admit(Conn(1, User("guest"))) is not None  # type: ignore[arg-type]  # waits


def test_a_server_that_never_had_a_root_waits_for_its_peers() -> None:
    """Starting alone (its peers not up yet) is not a partition."""
    net = Net(3, seed=1)
    for index in (0, 1):
        net.pause(index)
    net.run(3 * TIMEOUT)
    alone = net.nodes[2]
    assert alone.current_root is None and alone.standing.partition.reason is None
    assert alone.detaches == []


def test_a_server_healed_towards_the_others_only_detaches() -> None:
    """Healed towards the follower but still cut from the root: it cannot reach the
    root the follower reaches, so it sends its clients away (again: partitioned
    while cut from both, it had already)."""
    net = formed()
    net.cut(2, 0)
    net.cut(2, 1)
    net.run(2 * TIMEOUT)
    net.nodes[1].cut.discard("s2")
    net.nodes[2].cut.discard("s1")
    took = net.run_until(lambda: net.nodes[2].detached == "s0", limit=2 * TIMEOUT)
    assert took < 2 * INTERVAL, took
    reasons = [reason for _, reason in net.nodes[2].detaches]
    assert len(reasons) == 2 and "partitioned" in reasons[0] and "cannot reach root" in reasons[1]


def test_a_server_cut_from_an_owner_its_clients_use_sends_them_away_while_others_reach_it() -> None:
    """The bridge topology: one pair cut, the root hearing both. Nobody fails the
    owner over (the root hears it), so the server whose clients publish to its queue
    sends them elsewhere, as RabbitMQ promotes a partial partition; the other side of
    the cut, whose clients need nothing there, and the root carry on."""
    net = formed()
    publisher_side, owner = net.nodes[2], net.nodes[1]
    publisher_side.waits_on = lambda spid: "jobs" if spid == "s1" else None  # type: ignore[method-assign]
    net.cut(1, 2)
    took = net.run_until(lambda: publisher_side.standing.detachment.owner is not None, limit=3.0)
    assert INTERVAL / 2 <= took < 2 * INTERVAL + 0.2, took
    [(_, reason)] = publisher_side.detaches
    assert "cannot reach s1, the owner of queue 'jobs'" in reason and "reached by s0" in reason
    assert publisher_side.ready and publisher_side.detached is None  # in sync, still serving
    with pytest.raises(AMQPError) as info:
        publisher_side.admit(Conn(1, User("guest")))  # type: ignore[arg-type]
    assert info.value.reply_code == 320 and "owner of queue 'jobs'" in info.value.text
    net.run(2 * TIMEOUT)
    assert owner.detaches == [] and net.nodes[0].detaches == [] and net.root() == 0
    assert len(publisher_side.detaches) == 1, "one send-off for as long as the cut lasts"
    net.heal()
    net.run_until(lambda: publisher_side.standing.detachment.owner is None, limit=2 * TIMEOUT)
    assert publisher_side.admit(Conn(2, User("guest"))) is None  # type: ignore[arg-type]


def test_a_root_cut_from_an_owner_fails_it_over_and_keeps_its_clients() -> None:
    net = formed()
    root = net.nodes[0]
    root.waits_on = lambda spid: "jobs" if spid == "s1" else None  # type: ignore[method-assign]
    net.cut(0, 1)
    net.run(2 * TIMEOUT)
    assert root.detaches == [] and root.standing.detachment.owner is None


def test_an_owner_that_died_is_waited_for_not_a_reason_to_leave() -> None:
    """Nobody reaches a killed owner: its queues fail over, no witness, no send-off."""
    net = formed()
    net.nodes[2].waits_on = lambda spid: "jobs" if spid == "s1" else None  # type: ignore[method-assign]
    net.kill(1)
    net.run(2 * TIMEOUT)
    assert net.nodes[2].detaches == []
