"""Replicated shared queues without sockets: real planes, queues and replicas on the
in-memory network of tests/unit/cluster_net.py, pumped by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.replication.store import ReplicatingStore
from tests.support.examples import examples
from tests.unit.cluster_net import Net, Sink, Waiter, message


def owner_queue(net: Net, name: str = "q"):  # type: ignore[no-untyped-def]
    """The queue on its owner (the root's view of its placement)."""
    return net.queue(net.queue(net.root, name).owner, name)  # type: ignore[arg-type]


def bodies(net: Net, spid: str) -> list[tuple[bytes, bool]]:
    queue = net.queue(spid, "q")
    return [(m.body, redelivered) for m, redelivered in queue.ready()]


def test_a_confirm_waits_until_every_replica_has_the_message(net: Net) -> None:
    waiter = Waiter()
    assert net.queue("A", "q").push(message(b"m"), waiter)
    assert waiter.answers == []
    net.step(1)  # the stream reaches B only
    assert waiter.answers == []
    net.pump()
    assert waiter.answers == [(True, 1)]
    for spid in ("B", "C"):
        replica = net.servers[spid].queues.copies.queues["q"]
        assert [e.message.body for e in replica.entries.values()] == [b"m"]


def test_a_lone_root_confirms_at_once() -> None:
    net = Net()
    net.add("A")
    net.elect("A")
    net.declare("q")
    waiter = Waiter()
    net.queue("A", "q").push(message(b"m"), waiter)
    assert waiter.answers == []  # nothing deferred: the channel confirms at once
    assert net.servers["A"].queues.stream.seq == 0  # no stream without replicas


def test_the_new_root_serves_what_the_old_one_held_delivered_ones_flagged(net: Net) -> None:
    root = net.queue("A", "q")
    for i in range(4):
        root.push(message(b"%d" % i))
    sink = Sink("c", prefetch=2)
    net.queue("B", "q").add_consumer(sink, lambda error: None)
    net.pump()
    assert sink.bodies() == [b"0", b"1"]
    net.queue("B", "q").ack([sink.unacked.pop(0)])  # 0 is done: 2 follows
    net.pump()
    assert sink.bodies() == [b"0", b"1", b"2"]
    net.kill("A")
    assert net.root == "B"
    # 1 and 2 were delivered by A and never acked: back, flagged, in order
    assert bodies(net, "B") == [(b"1", True), (b"2", True), (b"3", False)]
    # the consumer's acks of what the dead root delivered settle nothing: its credit
    # comes back and it gets them again, flagged
    stale, sink.unacked = sink.unacked, []
    net.queue("B", "q").ack(stale)
    net.pump()
    assert [(m.body, r) for m, r in sink.got[3:]] == [(b"1", True), (b"2", True)]
    assert bodies(net, "B") == [(b"3", False)]


def test_a_delivery_leaves_once_a_majority_has_its_acquisition(net: Net) -> None:
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    sink = Sink("c")
    net.cut.add(("C", "A"))  # C's acks do not come back: the master and B are 2 of 3
    net.queue("B", "q").add_consumer(sink, lambda error: None)
    plane = net.servers["A"].queues
    net.pump()
    assert sink.bodies() == [b"m"]
    replicas = plane.stream
    assert replicas.replicas["C"].acked < replicas.seq == replicas.min_acked()


def test_a_replica_that_stops_acking_stays_in_the_set_and_raises_an_alarm(net: Net) -> None:
    net.cut.add(("C", "A"))  # C's acks do not come back; its link is up
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    plane = net.servers["A"].queues
    members = net.servers["A"].members
    members.now += 10
    plane.tick()
    assert "replication" in members.alarms
    assert "C" in plane.stream.replicas  # slow is not dead
    net.cut.discard(("C", "A"))
    net.servers["C"].queues.copies.ack()
    net.pump()
    plane.tick()
    assert "replication" not in members.alarms


def test_a_replica_that_joins_late_gets_a_snapshot(net: Net) -> None:
    root = net.queue("A", "q")
    for i in range(3):
        root.push(message(b"%d" % i))
    sink = Sink("c", prefetch=1)
    net.queue("B", "q").add_consumer(sink, lambda error: None)
    net.pump()
    net.join("D")
    net.pump()
    replica = net.servers["D"].queues.copies.queues["q"]
    assert replica.synced
    assert [(e.message.body, e.acquired) for _, e in replica.ordered()] == [
        (b"0", True),
        (b"1", False),
        (b"2", False),
    ]
    for spid in ("A", "B", "C"):
        net.kill(spid) if spid in net.servers else None
    assert net.root == "D"
    assert bodies(net, "D") == [(b"0", True), (b"1", False), (b"2", False)]


def test_a_joining_replica_follows_the_live_stream_and_never_stalls_confirms(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = net.queue("A", "q")
    for i in range(5):
        root.push(message(b"%d" % i))
    net.pump()
    replicas = net.servers["A"].queues.stream
    monkeypatch.setattr(replicas, "_schedule_sync", lambda: None)  # the snapshot waits
    net.join("D")
    net.pump()
    side = net.servers["D"].queues.copies
    stream = side.streams["A"]  # the root's
    assert stream.joined and not side.complete and replicas.replicas["D"].syncs
    waiter = Waiter()
    net.queue("B", "q").push(message(b"new"), waiter)
    net.pump()
    assert waiter.answers == [(True, 1)]  # confirmed while D's snapshot is still due
    assert [e.message.body for _, e in side.queues["q"].ordered()] == [b"new"]
    while replicas.sync_step():  # the snapshot, chunk by chunk, behind the live stream
        net.pump()
    net.pump()
    assert side.complete
    assert [e.message.body for _, e in side.queues["q"].ordered()] == [
        b"0",
        b"1",
        b"2",
        b"3",
        b"4",
        b"new",
    ]


def test_an_owner_cut_off_from_its_replicas_confirms_nothing_and_a_fence_nacks(
    net: Net,
) -> None:
    """An owner that lost every replica (a pause past the timeout: they went on
    without it) holds the only copy: no confirm. Once the fence reaches it, what
    waited is nacked (its queues fail over to the copies the others hold)."""
    owner = net.servers["A"]
    waiter = Waiter()
    net.queue("A", "q").push(message(b"m"), waiter)
    net.flush()
    net.wire.clear()  # the replicas never answer
    for spid in ("B", "C"):
        owner.queues.peer_lost(spid, "inactive")
    owner.queues.tick()
    assert waiter.answers == []  # only this server has it: no confirm
    owner.queues.fence("A", 1, net.log_seq + 1)
    assert owner.queues.is_fenced("A")
    assert waiter.answers == [(False, 0)]
    owner.queues.primary_seen("B")  # a fenced stream takes no replica again
    assert owner.queues.stream.replicas == {}


def test_a_fenced_stream_is_applied_and_acked_no_more(net: Net) -> None:
    waiter = Waiter()
    net.queue("A", "q").push(message(b"1"), waiter)
    net.pump()
    applied = net.servers["A"].queues.stream.seq  # where the fence finds the stream
    for spid in ("B", "C"):
        net.servers[spid].queues.fence("A", 1, net.log_seq + 1)
    net.queue("A", "q").push(message(b"2"), waiter)
    net.pump()
    assert waiter.answers == [(True, 1)]  # "2" waits for acks that never come
    for spid in ("B", "C"):
        replica = net.servers[spid].queues.copies
        assert [e.message.body for e in replica.queues["q"].entries.values()] == [b"1"]
        assert replica.fenced_report({"A"}) == {"A": {"q": [True, applied]}}


def test_a_purge_and_a_delete_reach_the_replicas(net: Net) -> None:
    root = net.queue("A", "q")
    root.push(message(b"x"))
    net.pump()
    root.drop_all()
    net.pump()
    assert net.servers["B"].queues.copies.queues["q"].entries == {}
    net.servers["A"].broker.vhosts["/"].remove_queue(root)
    net.pump()
    assert "q" not in net.servers["B"].queues.copies.queues


def test_a_gap_in_the_stream_asks_for_a_resync(net: Net) -> None:
    root = net.queue("A", "q")
    root.push(message(b"1"))
    net.flush()
    net.wire = type(net.wire)(m for m in net.wire if m[1] != "C")  # C misses it
    root.push(message(b"2"))
    net.pump()
    replica = net.servers["C"].queues.copies.queues["q"]
    assert [e.message.body for _, e in replica.ordered()] == [b"1", b"2"]


def test_the_old_root_keeps_its_content_as_a_replica_until_reset(net: Net) -> None:
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    net.place("q", "B")  # a move: A demotes, B promotes and resets A
    assert bodies(net, "B") == [(b"m", False)]
    assert net.queue("A", "q").message_count == 0
    assert [
        e.message.body for e in net.servers["A"].queues.copies.queues["q"].entries.values()
    ] == [b"m"]
    assert isinstance(net.queue("B", "q").store, ReplicatingStore)
    assert net.queue("A", "q").store is None  # the proxy's journal store (none here)


def test_members_says_which_replicas_hold_every_message(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In sync (what the console and ctl show) is a snapshot proven in and no stall:
    a replica still taking its snapshot is not, and does not count for the quorum."""
    root = net.queue("A", "q")
    for i in range(3):
        root.push(message(b"%d" % i))
    net.pump()
    replicas = net.servers["A"].queues.stream
    assert replicas.members() == [
        {"spid": "B", "in_sync": True, "behind": 0},
        {"spid": "C", "in_sync": True, "behind": 0},
    ]
    monkeypatch.setattr(replicas, "_schedule_sync", lambda: None)  # D's snapshot waits
    net.join("D")
    net.pump()
    assert not replicas.whole(replicas.replicas["D"])  # it lacks the older messages
    d = replicas.members()[2]
    assert (d["spid"], d["in_sync"]) == ("D", False)
    while replicas.sync_step():
        net.pump()
    net.pump()
    assert [m["in_sync"] for m in replicas.members()] == [True, True, True]

    net.cut.add(("C", "A"))  # C's acks stop coming back: behind, in sync until stalled
    root.push(message(b"late"))
    net.pump()
    c = {m["spid"]: m for m in replicas.members()}["C"]
    assert c["behind"] >= 1 and c["in_sync"]
    net.servers["A"].members.now += 10
    net.servers["A"].queues.tick()
    assert "C" in replicas.stalled
    assert {m["spid"]: m["in_sync"] for m in replicas.members()} == {
        "B": True,
        "C": False,
        "D": True,
    }
    # the queue reports the master's set; a proxy does not know
    assert net.queue("A", "q").replica_states() == replicas.members()
    assert net.queue("B", "q").replica_states() is None


def settle_syncs(net: Net) -> None:
    """The guarantee is for one failure at a time: a replica still taking its snapshot
    holds only part of the queue, so a kill waits until every snapshot is in (the
    live stream may still be in flight)."""
    replicas = net.servers[net.root].queues.stream  # type: ignore[index]
    if any(r.synced_at is None or r.acked < r.synced_at for r in replicas.replicas.values()):
        net.pump()


@settings(max_examples=examples(500), deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["pub", "pub", "get", "ack", "nack", "step", "pump", "kill", "killr", "join"]
        ),
        max_size=50,
    ),
    st.randoms(use_true_random=False),
)
def test_no_confirmed_message_is_lost_across_root_failures(actions: list[str], rnd) -> None:  # type: ignore[no-untyped-def]
    """Publishes and gets through any server, partial pumps, kills of the root or of
    another server, new servers joining: every confirmed message is at the end
    acked, or in the root's queue (ready or held); a message seen twice was flagged
    redelivered."""
    net = Net()
    for spid in ("A", "B", "C"):
        net.add(spid)
    net.elect("A")
    net.declare("q")
    confirmed: list[tuple[bytes, Waiter]] = []
    acked: set[bytes] = set()
    held: list[tuple[str, object]] = []
    seen: dict[bytes, int] = {}
    n = 0
    joined = 0
    for action in actions:
        alive = sorted(net.servers)
        if action == "pub":
            n += 1
            w = Waiter()
            if net.queue(rnd.choice(alive), "q").push(message(b"%d" % n), w):
                confirmed.append((b"%d" % n, w))
        elif action == "get":
            spid = rnd.choice(alive)
            got: list = []
            net.queue(spid, "q").get(False, got.append)
            net.pump()
            if got and got[0] is not None and not isinstance(got[0], Exception):
                m, redelivered, _ = got[0]
                seen[m.body] = seen.get(m.body, 0) + 1
                assert seen[m.body] == 1 or redelivered, m.body
                held.append((spid, m))
        elif action in ("ack", "nack") and held:
            spid, m = held.pop(0)
            if spid not in net.servers:
                continue
            queue = net.queue(spid, "q")
            if action == "ack":
                root = owner_queue(net)
                before = {e.message.body for e in root.store.entries.values()}  # type: ignore[union-attr]
                queue.ack([m])
                net.pump()
                after = {e.message.body for e in owner_queue(net).store.entries.values()}  # type: ignore[union-attr]
                if m.body in before and m.body not in after:  # type: ignore[attr-defined]
                    acked.add(m.body)  # type: ignore[attr-defined]
            else:
                queue.requeue([m])
                net.pump()
        elif action == "step":
            net.step(rnd.randint(1, 4))
        elif action == "kill" and len(alive) > 1:
            settle_syncs(net)
            net.kill(net.root)  # type: ignore[arg-type]
            held = [(s, m) for s, m in held if s in net.servers]
        elif action == "killr" and len(alive) > 2:
            settle_syncs(net)
            net.kill(rnd.choice([s for s in alive if s != net.root]))
            held = [(s, m) for s, m in held if s in net.servers]
        elif action == "join" and joined < 3:
            joined += 1
            spid = f"Z{joined}"
            net.join(spid)
        else:
            net.pump()
    net.pump()
    store = owner_queue(net).store
    assert isinstance(store, ReplicatingStore)
    kept = {e.message.body for e in store.entries.values()}
    for body, w in confirmed:
        if w.confirmed():
            assert body in acked or body in kept, body


def test_a_syncing_replica_does_not_confirm_for_a_paused_whole_one(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two faults at once: C restarts (as D, its snapshot under way) and B pauses.
    Had D's acks of the live stream confirmed a publish, the election, which
    prefers B's whole copy, would make B root without it when A dies. The confirm
    waits instead, and goes once D's copy is whole."""
    root = net.queue("A", "q")
    for i in range(5):
        root.push(message(b"old%d" % i))
    net.pump()
    net.kill("C")
    replicas = net.servers["A"].queues.stream
    monkeypatch.setattr(replicas, "_schedule_sync", lambda: None)  # the snapshot waits
    net.join("D")
    net.pump()
    net.cut |= {("A", "B"), ("B", "A")}  # B paused: its links stay up, nothing moves
    waiter = Waiter()
    root.push(message(b"new"), waiter)
    net.pump()
    side = net.servers["D"].queues.copies
    assert [e.message.body for _, e in side.queues["q"].ordered()] == [b"new"]
    assert waiter.answers == []  # D holds it, B does not: not confirmed
    assert not side.complete
    while replicas.sync_step():  # D's snapshot goes
        net.pump()
    net.pump()
    assert side.complete
    assert waiter.answers == [(True, 1)]  # D's copy is whole now: it counts
    bodies_d = sorted(e.message.body for _, e in side.queues["q"].ordered())
    assert bodies_d == [b"new", b"old0", b"old1", b"old2", b"old3", b"old4"]


def test_right_after_a_root_change_confirms_go_on_while_every_replica_syncs(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every replica is reset by a new root and takes its snapshot: none is whole,
    and their live streams confirm, so publishers do not wait for a deep queue's
    snapshot after a failover. Once a snapshot is sent, only whole replicas count."""
    for i in range(3):
        net.queue("A", "q").push(message(b"old%d" % i))
    net.pump()
    replicas = net.servers["B"].queues.stream
    monkeypatch.setattr(replicas, "_schedule_sync", lambda: None)  # snapshots wait
    net.kill("A")  # B is root now; C is reset and syncing
    assert net.root == "B"
    assert not any(replicas.whole(r) for r in replicas.replicas.values())
    waiter = Waiter()
    net.queue("C", "q").push(message(b"new"), waiter)
    net.pump()
    assert waiter.answers == [(True, 1)]  # C's live stream has it
    while replicas.sync_step():
        net.pump()
    net.pump()
    assert all(replicas.whole(r) for r in replicas.replicas.values())


def test_a_new_owners_reset_that_overtakes_the_placement_waits_for_it(net: Net) -> None:
    """The new owner's stream may reach the old owner before the placement that
    moved the queue: its reset is refused while the queue is still mastered there
    (its journal is the master's), and comes again once the old owner is a replica."""
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    epoch = net.queue("B", "q").epoch + 1
    net.queue("B", "q").place("B", epoch, None)  # applied on B first
    net.pump()
    old = net.servers["A"].queues.copies
    assert "q" not in old.queues and not old.streams["B"].joined  # refused, resync asked
    for spid in ("A", "C"):
        net.queue(spid, "q").place("B", epoch, None)
    net.pump()
    copy = old.queues["q"]
    assert copy.source == "B" and [e.message.body for e in copy.entries.values()] == [b"m"]


def test_a_fenced_server_streams_again_under_its_next_generation(net: Net) -> None:
    """A fenced owner (paused past the timeout) is still a sound replica of the
    others, and once its queues are placed elsewhere it streams again under its
    next generation: it can be a queue's next owner. A reset of its old generation
    that arrives late is refused."""
    net.queue("A", "q").push(message(b"1"))
    net.pump()
    net.fail_over("A")  # A's queue goes to B; A applies its own fence and the placement
    plane = net.servers["A"].queues
    assert not plane.stream.fenced and plane.stream.generation == 1
    net.pump()
    for spid in ("B", "C"):
        net.servers[spid].queues.fence("A", 1, 1)  # a sync replays the log: applied once
        assert net.servers[spid].queues.copies.fences == {"A": 1}
        assert not net.servers[spid].queues.is_fenced("A")  # its failover is over
    net.declare("q2", owner="A")  # A owns again, and confirms through its new stream
    fenced_at = net.servers["B"].queues.copies.fence_seq["A"]
    late = net.join("D", "q2")  # syncs a compacted log: A's fence, then q2 placed on A
    late.broker.vhosts["/"].declare_queue("q", connection_id=0)
    placed = net.queue("B", "q")
    net.queue("D", "q").place(placed.owner, placed.epoch, None, placed.placed_seq)
    late.queues.fence("A", 1, fenced_at)
    assert not late.queues.is_fenced("A")  # q2 was placed after the fence: not failed over
    waiter = Waiter()
    net.queue("A", "q2").push(message(b"2"), waiter)
    net.pump()
    assert waiter.answers == [(True, 1)]
    stale = rec.Batch()
    stale.replicate(0, rec.R_RESET, "", 0, 0)  # generation 0: from before the fence
    out = net.servers["B"].queues.transport.out("A")
    net.servers["B"].queues.copies.receive(out, rec.decode(stale.take()))  # type: ignore[arg-type]
    assert net.servers["B"].queues.copies.streams["A"].joined  # still generation 1's
    net.kill("B")  # q's new owner dies: A's copy of q is sound, and may be the heir
    assert [m.body for m, _r in net.queue(net.queue("C", "q").owner, "q").ready()] == [b"1"]


def test_a_new_owner_lost_during_its_snapshot_leaves_the_copies_whole(net: Net) -> None:
    """A takes a queue over and resets the others' copies to send its snapshot; lost
    before the snapshot is in, it must leave copies that still hold every message:
    each replica keeps what it had until the snapshot replaces it."""
    from collections import deque

    owner = net.queue("A", "q")
    # more than a snapshot chunk (``SYNC_CHUNK``): the snapshot takes several link messages
    bodies = [b"%04d" % i + b"x" * 1000 for i in range(1200)]
    waiters = [Waiter() for _ in bodies]
    for body, waiter in zip(bodies, waiters, strict=True):
        owner.push(message(body), waiter)
    net.pump()
    assert all(w.answers == [(True, 1)] for w in waiters)
    # A is lost; the root (B, elected) places the queue on B, which adopts it: C's copy
    # is reset and B's snapshot sets off for C
    del net.servers["A"]
    net.wire = deque(m for m in net.wire if m[0] != "A")
    for server in net.servers.values():
        server.queues.peer_lost("A", "inactive")
    net.elect("B")
    net.fail_over("A")
    assert net.queue("B", "q").local
    net.step(1)  # the reset and the snapshot's first part reach C, then B is lost too
    copy = net.servers["C"].queues.copies.queues["q"]
    assert not copy.synced and len(copy.entries) == len(bodies)  # nothing dropped early
    net.kill("B")
    survivor = net.queue("C", "q")
    assert survivor.local
    assert sorted(m.body for m, _r in survivor.ready()) == bodies


def test_a_reset_behind_stale_events_in_one_batch_is_applied(net: Net) -> None:
    """A replica that asked for a resync may get the source's last events from before
    the ask and its reset in one batch: the gap the stale events show must not make
    it drop the reset behind them, or it waits for a reset that never comes again
    (its ask was answered) and acks the source no more (CI: a rebalance's move to it
    never completed)."""
    root = net.queue("A", "q")
    root.push(message(b"1"))
    net.pump()
    side = net.servers["C"].queues.copies
    stream = side.streams["A"]
    side.resync(stream)  # asked (say a queue's reset overtook its placement)
    replicas = net.servers["A"].queues.stream
    seq = replicas.seq
    stale = rec.Replicate(stream.applied + 1, rec.R_SETTLE, "q", 0)  # sent before the ask
    reset = rec.Replicate(0, rec.R_RESET, "", seq, replicas.generation % 256)
    live = rec.Replicate(seq + 1, rec.R_SETTLE, "q", 0)
    side.receive(net.servers["C"].queues.transport.out("A"), [stale, reset, live])
    assert stream.joined and stream.applied == seq + 1


def test_a_publish_to_a_fenced_owner_is_confirmed_by_the_next_owner_only(net: Net) -> None:
    """A publish reaching an owner after its fence and before its queue is placed
    elsewhere (the soak's seed-3 loss, issue 41): it must not wait on the fenced
    stream, whose numbers go on under the next generation, where a replica that
    joins with nothing of the queue acks past it. It is kept for the next owner,
    and confirmed when that owner holds it."""
    owner = net.servers["A"]
    net.queue("A", "q").push(message(b"1"))
    net.pump()
    net.wire.clear()  # A is cut off: the others fence it
    for spid in ("B", "C"):
        owner.queues.peer_lost(spid, "inactive")
    owner.queues.fence("A", 1, net.log_seq + 1)
    late = Waiter()
    net.queue("A", "q").push(message(b"late"), late)  # still placed on A here
    net.pump()
    assert late.answers == []
    net.fail_over("A")  # the placement on another server reaches A: its stream restarts
    net.pump()
    heir = owner_queue(net, "q")
    assert heir.services.spid != "A"
    held = [m.body for m, _r in heir.ready()]
    assert late.answers == [(True, 1)] and b"late" in held, (late.answers, held)


@pytest.mark.parametrize("root_owns_queues", [True, False])
def test_a_server_that_notices_the_roots_loss_first_keeps_its_copys_place(
    root_owns_queues: bool,
) -> None:
    """The election ranks each primary by its copy of the last root's stream, as
    its status reports it. B notices the root's loss before C: B once reported no
    copy at all from that moment (and, when the root owned no queue, the stream
    was forgotten too), so both voted C in on a copy that might have been the
    shorter one; in a real cluster the next senior lost the election at random."""
    net = Net()
    for spid in ("A", "B", "C"):
        net.add(spid)
    net.elect("A")
    if root_owns_queues:
        net.declare("q")
        waiter = Waiter()
        net.queue("A", "q").push(message(b"m"), waiter)
        net.pump()
        assert waiter.answers == [(True, 1)]
    c = net.servers["C"].queues.copies
    place = ("A", c.applied, c.complete)
    assert place[1] > 0 and place[2]
    b = net.servers["B"].queues
    b.peer_lost("A", "inactive")  # B alone sees the root gone so far
    b.root_changed("A", None)
    assert (b.copies.source, b.copies.applied, b.copies.complete) == place
    # a new root's stream is what counts from then on
    net.elect("B")
    assert c.source == "B" and b.copies.source is None


def test_a_reset_behind_a_refused_one_in_one_batch_is_applied(net: Net) -> None:
    """A fenced owner that had not applied its fence yet answers its replicas with a
    reset of its old generation, which they refuse; once it applies the fence it
    resets them under the next one. On a slow loop both resets go in one batch: the
    refusal must skip only its own generation's records, not the reset behind them,
    or the replicas never take the new stream and the owner confirms nothing (the
    tenth session's soak: a queue moved onto it stalled its publishers 12.9 s)."""
    net.queue("A", "q").push(message(b"1"))
    net.pump()
    net.fail_over("A")  # fenced: A's stream starts again under generation 1
    net.pump()
    side = net.servers["B"].queues.copies
    assert side.fences == {"A": 1}
    stream = side.streams["A"]
    stream.joined = False  # as before a reset: what follows is the batch's to decide
    seq = net.servers["A"].queues.stream.seq
    stale = [
        rec.Replicate(0, rec.R_RESET, "", seq - 5, 0),  # generation 0: refused
        rec.Replicate(seq - 4, rec.R_SETTLE, "q", 0),  # of the refused generation
    ]
    current = [
        rec.Replicate(0, rec.R_RESET, "", seq, 1),
        rec.Replicate(seq + 1, rec.R_SETTLE, "q", 0),
    ]
    side.receive(net.servers["B"].queues.transport.out("A"), [*stale, *current])
    assert stream.joined and stream.applied == seq + 1
