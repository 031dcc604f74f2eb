"""Moving a replicated queue between owners (``queues.handover``) without sockets:
real planes, queues and replicas on the in-memory network of
tests/unit/cluster_net.py, with the state log's placements reaching each server
on its own schedule, as they do over real links."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.examples import examples
from tests.unit.cluster_net import Net, Sink, Waiter, message

SERVERS = ("A", "B", "C")


class Log:
    """The root's placements of ``q``, each applied by every server in turn."""

    def __init__(self, net: Net, servers: tuple[str, ...] = SERVERS) -> None:
        self.net = net
        self.servers = servers
        queue = net.queue("A", "q")
        #: (owner, epoch, moving to)
        self.entries: list[tuple[str, int, str | None]] = [(queue.owner, queue.epoch, None)]
        self.applied = dict.fromkeys(servers, 1)
        self.live = list(servers)
        for spid in servers:
            net.servers[spid].queues.handovers.on_handed = self.handed

    def order(self, owner: str, moving: str | None) -> None:
        epoch = self.entries[-1][1] + 1
        self.entries.append((owner, epoch, moving))

    def handed(self, queue: Any, to: str) -> None:
        """The owner asks for the placement on the target (the root orders it)."""
        owner, _epoch, moving = self.entries[-1]
        assert moving == to and queue.owner == owner
        self.order(to, None)

    def apply_next(self, spid: str) -> bool:
        if spid not in self.live:
            return False
        index = self.applied[spid]
        if index >= len(self.entries):
            return False
        owner, epoch, moving = self.entries[index]
        self.applied[spid] = index + 1
        self.net.log_seq += 1
        self.net.queue(spid, "q").place(owner, epoch, None, self.net.log_seq, moving)
        return True

    def apply_all(self) -> None:
        while any(self.apply_next(spid) for spid in self.servers):
            self.net.pump()

    def kill(self, spid: str) -> None:
        """kill -9 of ``spid`` once every placement ordered so far is applied: the
        root fences it and fails its queue over (``Net.kill``), which ends a move
        of it under way; the log records the placement every live server applied.
        A placement ordered meanwhile (the hand-over the loss let finish) is
        applied, and a move whose target is lost is called off, as the root's
        ``Mover.check`` does. (Before, the model marked every entry applied
        without applying the hand-over's, and ordered no call-off: the owner
        stayed "moving" for good. Hypothesis found both.)"""
        self.apply_all()
        self.live.remove(spid)
        self.net.kill(spid)
        queue = self.net.queue(self.live[0], "q")
        if queue.epoch > self.entries[-1][1]:
            # failed over: ``Net.fail_over`` placed it on every live server
            self.entries.append((queue.owner, queue.epoch, None))
            for other in self.live:
                self.applied[other] = len(self.entries)
            return
        self.apply_all()  # what was ordered meanwhile: an owner's hand-over done
        queue = self.net.queue(self.live[0], "q")
        if queue.moving == spid and queue.owner in self.live:
            # the move's target is lost: the root calls the move off, a placement on
            # the owner (``moving.Mover.check``), which every live server applies
            self.order(queue.owner, None)
            self.apply_all()

    @property
    def moving(self) -> bool:
        return self.entries[-1][2] is not None


class Handovers(RuleBasedStateMachine):
    """Publishes from every server, a consumer on C acking, moves, and the loss of
    an owner (or a replica) at most once, interleaved with partial deliveries of
    the network and of the state log."""

    servers: tuple[str, ...] = SERVERS
    #: the queue's quorum group (None: every server keeps a copy)
    group: tuple[str, ...] | None = None
    consumer = "C"

    def __init__(self) -> None:
        super().__init__()
        net = self.net = Net()
        for spid in self.servers:
            net.add(spid)
        net.elect("A")
        net.declare("q", group=self.group)
        self.log = Log(net, self.servers)
        self.sink = Sink("c", prefetch=5)
        net.queue(self.consumer, "q").add_consumer(self.sink, lambda error: None)
        self.sent: list[tuple[str, int, Waiter]] = []
        self.count = 0

    @precondition(lambda self: len(self.log.live) == len(self.servers))
    @rule(spid=st.sampled_from(("A", "B")))
    def kill(self, spid: str) -> None:
        """One server lost (the consumer's stays): its queue fails over."""
        self.log.kill(spid)

    @rule(spid=st.sampled_from(("A", "B", "C", "D")))
    def publish(self, spid: str) -> None:
        if spid not in self.log.live:
            return
        self.count += 1
        waiter = Waiter()
        body = f"{spid}:{self.count}".encode()
        self.net.queue(spid, "q").push(message(body, publisher=ord(spid)), waiter)
        self.sent.append((spid, self.count, waiter))

    @rule(count=st.integers(1, 6))
    def deliver_some(self, count: int) -> None:
        self.net.step(count)

    @rule()
    def pump(self) -> None:
        self.net.pump()

    @rule(spid=st.sampled_from(("A", "B", "C", "D")))
    def apply_log(self, spid: str) -> None:
        self.log.apply_next(spid)

    @precondition(lambda self: self.sink.unacked)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, len(self.sink.unacked)))
        acked, self.sink.unacked = self.sink.unacked[:n], self.sink.unacked[n:]
        self.net.queue(self.consumer, "q").ack(acked)

    @precondition(lambda self: not self.log.moving)
    @rule(to=st.sampled_from(("A", "B", "C", "D")))
    def move(self, to: str) -> None:
        """An operator's move; the root refuses one to a server outside the group."""
        owner = self.log.entries[-1][0]
        if to != owner and to in self.log.live and (self.group is None or to in self.group):
            self.log.order(owner, to)

    @invariant()
    def at_most_one_server_delivers(self) -> None:
        delivering = [
            spid
            for spid in self.log.live
            if (q := self.net.queue(spid, "q")).local and q.moving is None
        ]
        assert len(delivering) <= 1, delivering

    def teardown(self) -> None:
        net, sink = self.net, self.sink
        self.log.apply_all()
        for _ in range(3):
            net.tick()
            self.log.apply_all()
        # the consumer takes the rest, acking as it goes
        for _ in range(200):
            if sink.unacked:
                acked, sink.unacked = sink.unacked, []
                net.queue(self.consumer, "q").ack(acked)
            net.pump()
            self.log.apply_all()
            if not sink.unacked:
                break
        owner = self.log.entries[-1][0]
        assert net.queue(owner, "q").local and net.queue(owner, "q").moving is None
        got = [(m.body, redelivered) for m, redelivered in sink.got]
        bodies = [body for body, _r in got]
        for spid, n, waiter in self.sent:  # the lost server's too
            body = f"{spid}:{n}".encode()
            if waiter.confirmed():
                assert body in bodies, f"confirmed {body!r} lost"
        seen: set[bytes] = set()
        last: dict[str, int] = {}
        for body, redelivered in got:
            assert redelivered or body not in seen, f"unflagged duplicate {body!r}"
            if body not in seen:
                spid, n = body.decode().split(":")
                if not redelivered:
                    assert int(n) > last.get(spid, 0), f"{body!r} overtook"
                    last[spid] = int(n)
            seen.add(body)


TestHandovers = Handovers.TestCase
TestHandovers.settings = settings(max_examples=examples(150), stateful_step_count=40, deadline=None)


class GroupedHandovers(Handovers):
    """The same with four primaries and a quorum group of three (A, B, C): the
    consumer is on D, which keeps no copy; moves stay within the group, and a lost
    member leaves the two others a majority. Nothing confirmed is lost, and no two
    servers deliver at once."""

    servers = ("A", "B", "C", "D")
    group = ("A", "B", "C")
    consumer = "D"

    @invariant()
    def the_outsider_keeps_no_copy(self) -> None:
        if "D" in self.net.servers:
            copy = self.net.servers["D"].queues.copies.queues.get("q")
            assert copy is None or not copy.entries


TestGroupedHandovers = GroupedHandovers.TestCase
TestGroupedHandovers.settings = settings(
    max_examples=examples(100), stateful_step_count=40, deadline=None
)


def test_a_move_waits_for_every_server_to_drain_then_for_the_target(net: Net) -> None:
    """The owner freezes only once each linked server's ``Drained`` is in, and asks for
    the placement only once the target acked the stream that far."""
    log = Log(net)
    owner = net.queue("A", "q")
    for i in range(3):
        owner.push(message(b"%d" % i))
    net.pump()
    log.order("A", "B")
    log.apply_next("A")
    handover = net.servers["A"].queues.handovers.out["q"]
    assert handover.waiting == {"B", "C"} and not owner.frozen
    log.apply_next("B")
    net.pump()
    assert handover.waiting == {"C"} and not owner.frozen
    # C publishes before it learns of the move: its forward goes in ahead of its Drained
    waiter = Waiter()
    net.queue("C", "q").push(message(b"3", publisher=2), waiter)
    log.apply_next("C")
    net.pump()
    assert owner.frozen and handover.asked
    assert log.entries[-1] == ("B", 3, None)
    assert waiter.answers == [(True, 1)]  # in A's stream before the point: B holds it
    log.apply_all()
    moved = net.queue("B", "q")
    assert moved.local and [m.body for m, _r in moved.ready()] == [b"0", b"1", b"2", b"3"]
    assert not net.queue("A", "q").local


def test_a_drained_record_before_its_placement_counts(net: Net) -> None:
    """B applies the move and drains before A, the owner, has the placement."""
    log = Log(net)
    log.order("A", "C")
    log.apply_next("B")
    log.apply_next("C")
    net.pump()  # both Drained records reach A first
    log.apply_next("A")
    net.pump()
    assert log.entries[-1] == ("C", 3, None)
    log.apply_all()
    assert net.queue("C", "q").local


def test_gets_and_publishes_on_the_owner_wait_for_the_move(net: Net) -> None:
    log = Log(net)
    owner = net.queue("A", "q")
    owner.push(message(b"0"))
    net.pump()
    log.order("A", "B")
    log.apply_next("A")  # A locks the queue: the others have not drained yet
    got: list[Any] = []
    owner.get(False, got.append)
    assert got == []  # waits
    log.apply_all()
    net.tick()  # asked of B before B had the placement: asked again
    assert len(got) == 1 and got[0] is not None and got[0][0].body == b"0"


def test_ctl_queues_shows_a_move_under_way(net: Net) -> None:
    from brokerd.server.dump import queue_table

    class Server:  # what queue_table reads of the server
        spid = "A"
        broker = net.servers["A"].broker

    log = Log(net)
    log.order("A", "B")
    log.apply_next("A")
    [row] = queue_table(Server())  # type: ignore[arg-type]
    assert (row["owner"], row["moving"]) == ("A", "B")
    log.apply_all()
    [row] = queue_table(Server())  # type: ignore[arg-type]
    assert (row["owner"], row["moving"]) == ("B", None)


def test_the_queue_table_prints_the_target(capsys: Any) -> None:
    from brokerd.ctl.text import print_queues

    row = {
        "vhost": "/",
        "name": "q",
        "type": "replicated",
        "role": "master",
        "owner": "A",
        "moving": "B",
        "messages": 0,
        "consumers": 0,
        "replicas": [],
    }
    print_queues({"spid": "A", "queues": [row]})
    assert "A (here) -> B" in capsys.readouterr().out


def test_a_target_still_taking_another_queues_snapshot_holds_this_one(net: Net) -> None:
    """A move waits for the target to hold the queue, not for all of the owner's
    snapshots to it: one of another queue still under way does not hold it up."""
    from collections import deque

    replicas = net.servers["A"].queues.stream
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    link = replicas.replicas["B"]
    assert replicas.holds("B", "q", replicas.seq)
    # another queue's snapshot to B is under way: B is not whole any more
    link.synced_at = None
    link.syncs.append(("other", deque([1])))
    assert not replicas.whole(link)
    sent = link.queues["q"]
    assert link.acked > sent  # q's snapshot was followed by an event B acked
    assert replicas.holds("B", "q", replicas.seq)
    assert not replicas.holds("B", "other", replicas.seq)
    assert not replicas.holds("B", "q", replicas.seq + 1)  # not acked that far
    # q's snapshot just went whole and nothing followed: an event is sent to prove it
    link.queues["q"] = replicas.seq
    before = replicas.seq
    assert not replicas.holds("B", "q", before)
    assert replicas.seq == before + 1
    net.pump()
    assert replicas.holds("B", "q", before)


class _Draw:
    """A stand-in for hypothesis's ``data`` in a replayed step: draws what it is told."""

    def __init__(self, value: int) -> None:
        self.value = value

    def draw(self, _strategy: object) -> int:
        return self.value


def test_a_failover_then_a_move_delivers_nothing_twice_unflagged() -> None:
    """The state machine found this (make test-fast, 2026-11-29; the code had not
    changed): A, the owner, is lost, a move to C is ordered, B publishes twice
    while the placements reach B, C and D one by one, the consumer on D acks one,
    and B:2 came to it a second time without the redelivered flag. The ack,
    reaching B while it handed the queue over, freed the consumer's credit, and
    the model queue dispatched by itself: B delivered B:2 although a queue being
    handed over delivers nothing, and C, taking over from its copy, delivered it
    again. The model queue now has ``delivering``, off for such an owner."""
    machine = GroupedHandovers()
    machine.kill(spid="A")
    machine.move(to="C")
    machine.publish(spid="B")
    for spid in ("B", "C", "D"):
        machine.apply_log(spid=spid)
    machine.publish(spid="B")
    machine.pump()
    machine.ack(data=_Draw(1))  # type: ignore[arg-type]
    machine.apply_log(spid="C")
    machine.pump()
    machine.teardown()
