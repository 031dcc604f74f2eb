"""A quorum queue whose ``x-quorum-initial-group-size`` leaves some primaries out: its
events reach its group alone, and its confirms and deliveries wait for a majority of
its group, not of every primary (``replicaset.Stream``; the in-memory net of
``cluster_net``, where a server's address is its spid)."""

from __future__ import annotations

import pytest

from tests.unit.cluster_net import Net, Sink, Waiter, message


@pytest.fixture
def net4() -> Net:
    """Primaries A, B, C and D (a majority of all four is three), A root, and the
    replicated queue ``q`` every primary keeps."""
    net = Net()
    for spid in "ABCD":
        net.add(spid)
    net.elect("A")
    net.declare("q")
    return net


def declare_grouped(net: Net, name: str, group: tuple[str, ...], owner: str = "A") -> None:
    """What a declare the root placed with a group does on every server."""
    for server in net.servers.values():
        server.broker.vhosts["/"].declare_queue(name, connection_id=0)
        net.queue(server.spid, name).group = group
    net.place(name, owner)
    net.pump()


def copy_of(net: Net, spid: str, name: str) -> list[bytes]:
    replica = net.servers[spid].queues.copies.queues.get(name)
    return [] if replica is None else [e.message.body for _mid, e in replica.ordered()]


def test_a_group_of_two_confirms_on_its_member_alone_and_the_others_keep_no_copy(
    net4: Net,
) -> None:
    declare_grouped(net4, "g", ("A", "B"))
    net4.cut |= {("C", "A"), ("D", "A")}  # C's and D's acks never come back
    grouped, everywhere = Waiter(), Waiter()
    net4.queue("A", "g").push(message(b"g1"), grouped)
    net4.queue("A", "q").push(message(b"q1"), everywhere)
    net4.pump()
    assert grouped.confirmed() and grouped.deferred == 1  # B's ack is a majority of A, B
    assert everywhere.answers == []  # three of four primaries: B's ack is not enough
    assert copy_of(net4, "B", "g") == [b"g1"]
    assert copy_of(net4, "C", "g") == copy_of(net4, "D", "g") == []
    assert copy_of(net4, "C", "q") == [b"q1"]  # the stream reached C: only its acks are cut


def test_a_group_waits_for_its_member_whatever_the_others_ack(net4: Net) -> None:
    declare_grouped(net4, "g", ("A", "B"))
    net4.cut.add(("B", "A"))
    waiter = Waiter()
    net4.queue("A", "g").push(message(b"g1"), waiter)
    net4.pump()
    assert waiter.answers == []  # C and D acked its number, but they are not of its group
    net4.cut.discard(("B", "A"))
    net4.servers["B"].queues.copies.ack()
    net4.pump()
    assert waiter.confirmed()


def test_a_delivery_waits_for_its_groups_floor(net4: Net) -> None:
    declare_grouped(net4, "g", ("A", "B"))
    net4.queue("A", "g").push(message(b"g1"))
    net4.pump()
    net4.cut.add(("B", "A"))  # B's ack of the acquisition never comes
    sink = Sink("c")
    net4.queue("C", "g").add_consumer(sink, lambda error: None)  # attached at A
    net4.pump()
    assert sink.bodies() == []  # held at its gate: C's and D's acks do not count
    net4.cut.discard(("B", "A"))
    net4.servers["B"].queues.copies.ack()
    net4.pump()
    assert sink.bodies() == [b"g1"]


def test_a_group_of_one_numbers_nothing_and_confirms_at_once(net4: Net) -> None:
    declare_grouped(net4, "g", ("A",))
    plane = net4.servers["A"].queues
    seq = plane.stream.seq
    waiter = Waiter()
    net4.queue("A", "g").push(message(b"alone"), waiter)
    net4.pump()
    assert waiter.deferred == 0  # nothing to wait for: the channel confirms at once
    assert plane.stream.seq == seq
    assert all(copy_of(net4, spid, "g") == [] for spid in "BCD")


def test_a_member_that_joins_late_gets_the_groups_snapshot_and_a_non_member_none() -> None:
    net = Net()
    for spid in "ABC":
        net.add(spid)
    net.elect("A")
    declare_grouped(net, "g", ("A", "D"))
    for i in range(3):
        net.queue("A", "g").push(message(b"%d" % i))
    net.pump()
    net.join("D", "g")
    net.queue("D", "g").group = ("A", "D")
    net.join("E", "g")
    net.queue("E", "g").group = ("A", "D")
    net.pump()
    assert copy_of(net, "D", "g") == [b"0", b"1", b"2"]
    assert copy_of(net, "E", "g") == copy_of(net, "B", "g") == []
    states = net.queue("A", "g").replica_states()
    assert [s["spid"] for s in states or []] == ["D"]  # its group's replicas alone


def test_the_group_moves_with_its_owner_and_the_new_owner_streams_to_the_old(
    net4: Net,
) -> None:
    declare_grouped(net4, "g", ("A", "B"))
    for i in range(3):
        net4.queue("A", "g").push(message(b"%d" % i))
    net4.pump()
    net4.place("g", "B")  # a move's last placement: B owns it now
    net4.pump()
    waiter = Waiter()
    net4.queue("B", "g").push(message(b"3"), waiter)
    net4.cut |= {("C", "B"), ("D", "B")}
    net4.pump()
    assert waiter.confirmed()  # A's ack: the majority of A and B
    assert copy_of(net4, "A", "g") == [b"0", b"1", b"2", b"3"]
    assert copy_of(net4, "C", "g") == copy_of(net4, "D", "g") == []


def test_publishes_no_majority_of_the_group_holds_go_to_the_next_owner(net4: Net) -> None:
    """The old owner passes on what its group's floor has not reached; C's and D's
    acks of the numbers alone must not count (before the fix, the stream forgot the
    group before the old owner asked, and the floor of every primary let them go)."""
    declare_grouped(net4, "g", ("A", "B"))
    net4.cut.add(("A", "B"))  # B never gets them: the stream to it is cut
    for i in range(3):
        net4.queue("A", "g").push(message(b"u%d" % i))  # unconfirmed: no waiter
    net4.pump()
    assert copy_of(net4, "B", "g") == []
    net4.cut.discard(("A", "B"))
    net4.place("g", "B")  # failed over to B (its only other member)
    net4.pump()
    assert [m.body for m, _r in net4.queue("B", "g").ready()] == [b"u0", b"u1", b"u2"]


def regroup(net: Net, name: str, group: tuple[str, ...]) -> None:
    """What a ``queue.group`` entry does on every server (``SharedQueue.regroup``)."""
    for spid in net.servers:
        net.queue(spid, name).regroup(group)


def test_a_grown_member_gets_the_snapshot_and_counts_once_it_holds_the_queue(
    net4: Net,
) -> None:
    declare_grouped(net4, "g", ("A", "B"))
    for i in range(3):
        net4.queue("A", "g").push(message(b"%d" % i))
    net4.pump()
    assert copy_of(net4, "C", "g") == []
    stream = net4.servers["A"].queues.stream
    regroup(net4, "g", ("A", "B", "C"))
    assert stream.growing == {"g": {"C"}}, "C counts for nothing before it holds g"
    net4.cut.add(("B", "A"))  # confirms now rest on C
    waiter = Waiter()
    net4.queue("A", "g").push(message(b"3"), waiter)
    net4.pump()
    net4.servers["C"].queues.copies.ack()
    net4.pump()
    assert copy_of(net4, "C", "g") == [b"0", b"1", b"2", b"3"]
    assert stream.growing == {} and waiter.confirmed()


def test_a_grown_member_counts_though_no_publish_follows_its_snapshot(net4: Net) -> None:
    """The last publish before the old member goes is in the grown member's snapshot
    (a publisher that waits for each confirm sends no other): the owner sends an
    event after the snapshot for its ack to prove the member holds the queue
    (before the fix, none came, and the confirm waited for ever)."""
    declare_grouped(net4, "g", ("A", "B"))
    net4.queue("A", "g").push(message(b"0"))
    net4.pump()
    stream = net4.servers["A"].queues.stream
    stream._syncing = True  # as on a running loop: the snapshot goes on a later turn
    regroup(net4, "g", ("A", "B", "C"))
    net4.cut.add(("B", "A"))  # B is gone: its acks never come again
    waiter = Waiter()
    net4.queue("A", "g").push(message(b"1"), waiter)  # before the snapshot is sent
    while stream.sync_step():
        pass
    stream._syncing = False
    for _ in range(3):
        net4.pump()
        net4.servers["C"].queues.copies.ack()
    net4.pump()
    assert copy_of(net4, "C", "g") == [b"0", b"1"]
    assert waiter.confirmed() and net4.servers["A"].queues.stream.growing == {}


def test_what_waits_on_the_old_group_waits_on_the_grown_one(net4: Net) -> None:
    """A confirm waiting for B when the group grows is released by the new group's
    floor once C holds the queue, B gone for good (before the fix it waited for the
    old group's, which only B could move)."""
    declare_grouped(net4, "g", ("A", "B"))
    net4.queue("A", "g").push(message(b"0"))
    net4.pump()
    net4.cut.add(("B", "A"))
    waiter = Waiter()
    net4.queue("A", "g").push(message(b"1"), waiter)
    net4.pump()
    assert waiter.answers == []
    regroup(net4, "g", ("A", "B", "C"))
    for _ in range(3):
        net4.pump()
        net4.servers["C"].queues.copies.ack()
    net4.pump()
    assert copy_of(net4, "C", "g") == [b"0", b"1"]
    assert waiter.confirmed()


def test_a_group_shared_with_another_queue_keeps_its_waiters(net4: Net) -> None:
    """Two queues of one group: when one grows, what waits on the other stays on the
    old group's floor (C holds nothing of the other queue)."""
    declare_grouped(net4, "g", ("A", "B"))
    declare_grouped(net4, "h", ("A", "B"))
    net4.cut.add(("B", "A"))
    waiter = Waiter()
    net4.queue("A", "h").push(message(b"h"), waiter)
    net4.pump()
    regroup(net4, "g", ("A", "B", "C"))
    for _ in range(3):
        net4.pump()
        net4.servers["C"].queues.copies.ack()
    assert waiter.answers == []
    net4.cut.discard(("B", "A"))
    net4.servers["B"].queues.copies.ack()
    net4.pump()
    assert waiter.confirmed()


def test_a_shrunk_group_confirms_on_the_rest_and_the_member_left_out_drops_its_copy(
    net4: Net,
) -> None:
    declare_grouped(net4, "g", ("A", "B", "C"))
    net4.queue("A", "g").push(message(b"0"))
    net4.pump()
    assert copy_of(net4, "C", "g") == [b"0"]
    regroup(net4, "g", ("A", "B"))
    assert copy_of(net4, "C", "g") == []
    net4.cut.add(("B", "A"))  # only C's acks come: C is out of the group
    waiter = Waiter()
    net4.queue("A", "g").push(message(b"1"), waiter)
    net4.pump()
    assert waiter.answers == []
    net4.cut.discard(("B", "A"))
    net4.servers["B"].queues.copies.ack()
    net4.pump()
    assert waiter.confirmed() and copy_of(net4, "B", "g") == [b"0", b"1"]


@pytest.mark.xfail(
    strict=True,
    reason="known gap (eleventh session): a shrink is ordered without the staying "
    "members holding what the old group confirmed; the root should wait for them",
)
def test_a_shrink_never_leaves_a_confirmed_message_with_its_owner_alone() -> None:
    """A confirmed on B's ack while C lagged; B shrunk out of the group, A then dies:
    C, the only member left, must still have the message (it has not: the fix must
    make the shrink wait until a majority of the staying members holds the queue as
    far as the old group confirmed it, or keep the leaving member's copy till then)."""
    net = Net()
    for spid in "ABCD":
        net.add(spid)
    net.elect("D")  # the root elsewhere: A owns the queue
    net.declare("q")
    declare_grouped(net, "g", ("A", "B", "C"))
    net.cut.add(("A", "C"))  # C lags: nothing of A's stream reaches it for now
    waiter = Waiter()
    net.queue("A", "g").push(message(b"m"), waiter)
    net.pump()
    assert waiter.confirmed() and copy_of(net, "B", "g") == [b"m"]
    regroup(net, "g", ("A", "C"))
    net.pump()
    net.kill("A")
    assert net.queue("C", "g").local
    assert [m.body for m, _r in net.queue("C", "g").ready()] == [b"m"]
