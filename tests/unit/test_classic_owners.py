"""Classic shared queues on owners of their own, over the in-memory message plane
(tests/unit/cluster_net.py): real planes, queues, proxies and masters; the state
log's placements applied on every server as the root orders them.

A hypothesis state machine runs any interleaving of declares, publishes through
any server, gets through any server, consumers, an owner lost and returning (a
durable queue waits for it), and root changes. Invariants: each queue is mastered
on exactly its placed owner and nowhere else (nowhere while it is unavailable);
a root change moves no classic queue; every publish confirmed is got exactly
once, in order per queue; a publish while the owner is away is nacked.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.support.examples import examples
from tests.unit.cluster_net import Net, Sink, Waiter, message

SERVERS = ("A", "B", "C")
CLASSIC = {"x-queue-type": "classic"}


def place_everywhere(net: Net, name: str, owner: str | None, epoch: int, home: str | None) -> None:
    """What applying a placement from the state log does on every server."""
    for server in net.servers.values():
        queue = server.broker.vhosts["/"].queues[name]
        queue.place(owner, epoch, home)  # type: ignore[attr-defined]


def declare_classic(net: Net, name: str, owner: str) -> None:
    for server in net.servers.values():
        server.broker.vhosts["/"].declare_queue(
            name, connection_id=0, durable=True, arguments=dict(CLASSIC)
        )
    place_everywhere(net, name, owner, 1, None)
    net.pump()


def get_all(net: Net, via: str, name: str) -> list[bytes]:
    got: list[bytes] = []
    while True:
        answers: list[Any] = []
        net.queue(via, name).get(True, answers.append)
        net.pump()
        assert len(answers) == 1, answers
        if answers[0] is None:
            return got
        assert not isinstance(answers[0], Exception), answers[0]
        got.append(answers[0][0].body)


def test_a_classic_queue_is_mastered_on_its_owner_and_reached_from_everywhere(net: Net) -> None:
    declare_classic(net, "c", "B")
    assert [s for s in SERVERS if net.queue(s, "c").local] == ["B"]
    waiter = Waiter()
    assert net.queue("C", "c").push(message(b"via-c"), waiter)
    net.pump()
    assert waiter.confirmed()
    # the root (A) is a proxy like C: the message is on B only
    assert net.queue("B", "c").message_count == 1
    assert net.queue("A", "c").message_count == 0
    sink = Sink("s", prefetch=5)
    answers: list[object] = []
    net.queue("A", "c").add_consumer(sink, answers.append)
    net.pump()
    assert answers == [None] and sink.bodies() == [b"via-c"]
    net.queue("A", "c").ack(sink.unacked)
    net.pump()
    assert net.queue("B", "c").message_count == 0 and net.queue("B", "c").unacked == 0


def test_a_root_change_moves_no_classic_queue(net: Net) -> None:
    declare_classic(net, "c", "B")
    net.queue("C", "c").push(message(b"kept"), Waiter())
    net.pump()
    net.elect("C")
    assert [s for s in SERVERS if net.queue(s, "c").local] == ["B"]
    assert get_all(net, "A", "c") == [b"kept"]


def test_an_unavailable_queue_nacks_publishes_and_refuses_gets(net: Net) -> None:
    declare_classic(net, "c", "B")
    place_everywhere(net, "c", None, 2, "127.0.0.1:5702")
    waiter = Waiter()
    assert not net.queue("C", "c").push(message(b"lost?"), waiter)
    answers: list[Any] = []
    net.queue("A", "c").get(True, answers.append)
    assert answers and answers[0].reply_code == 404
    assert "home node '127.0.0.1:5702'" in answers[0].text


class ClassicOwners(RuleBasedStateMachine):
    """Any interleaving keeps one owner per queue and every confirmed message."""

    @initialize()
    def setup(self) -> None:
        self.net = Net()
        for spid in SERVERS:
            self.net.add(spid)
        self.net.elect("A")
        #: queue -> (owner or None, epoch, home)
        self.placed: dict[str, tuple[str | None, int, str | None]] = {}
        #: queue -> bodies confirmed and not yet got, in order
        self.expected: dict[str, list[bytes]] = {}
        self.count = 0

    @rule(owner=st.sampled_from(SERVERS))
    def declare(self, owner: str) -> None:
        if len(self.placed) >= 3:
            return
        name = f"c{len(self.placed)}"
        declare_classic(self.net, name, owner)
        self.placed[name] = (owner, 1, None)
        self.expected[name] = []

    @precondition(lambda self: self.placed)
    @rule(data=st.data(), via=st.sampled_from(SERVERS), n=st.integers(1, 4))
    def publish(self, data: st.DataObject, via: str, n: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.placed)))
        owner = self.placed[name][0]
        waiters = []
        for _ in range(n):
            self.count += 1
            body = b"%s-%d" % (name.encode(), self.count)
            waiter = Waiter()
            taken = self.net.queue(via, name).push(message(body), waiter)
            waiters.append((body, taken, waiter))
        self.net.pump()
        for body, taken, waiter in waiters:
            if owner is None:
                assert not taken or not waiter.confirmed(), "confirmed with nobody to own it"
            else:
                assert taken and waiter.confirmed()
                self.expected[name].append(body)

    @precondition(lambda self: any(p[0] is not None for p in self.placed.values()))
    @rule(data=st.data(), via=st.sampled_from(SERVERS))
    def drain(self, data: st.DataObject, via: str) -> None:
        name = data.draw(
            st.sampled_from(sorted(n for n, p in self.placed.items() if p[0] is not None))
        )
        assert get_all(self.net, via, name) == self.expected[name]
        self.expected[name] = []

    @precondition(lambda self: self.placed)
    @rule(data=st.data(), via=st.sampled_from(SERVERS))
    def consume_one(self, data: st.DataObject, via: str) -> None:
        """A consumer on any server takes the head, acks it and goes."""
        name = data.draw(st.sampled_from(sorted(self.placed)))
        if self.placed[name][0] is None or not self.expected[name]:
            return
        sink = Sink(f"s{self.count}", prefetch=1)
        answers: list[object] = []
        queue = self.net.queue(via, name)
        queue.add_consumer(sink, answers.append)
        self.net.pump()
        assert answers == [None]
        assert sink.bodies() == self.expected[name][:1]
        queue.ack(sink.unacked)
        queue.remove_consumer(sink)
        self.net.pump()
        self.expected[name].pop(0)

    @precondition(lambda self: any(p[0] is not None for p in self.placed.values()))
    @rule(data=st.data())
    def owner_away(self, data: st.DataObject) -> None:
        """The root finds the owner lost: the durable queue waits for it."""
        name = data.draw(
            st.sampled_from(sorted(n for n, p in self.placed.items() if p[0] is not None))
        )
        owner, epoch, _home = self.placed[name]
        place_everywhere(self.net, name, None, epoch + 1, owner)
        self.placed[name] = (None, epoch + 1, owner)
        self.net.pump()

    @precondition(lambda self: any(p[0] is None for p in self.placed.values()))
    @rule(data=st.data())
    def owner_back(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, p in self.placed.items() if p[0] is None)))
        _owner, epoch, home = self.placed[name]
        place_everywhere(self.net, name, home, epoch + 1, None)
        self.placed[name] = (home, epoch + 1, None)
        self.net.pump()

    @rule(root=st.sampled_from(SERVERS))
    def elect(self, root: str) -> None:
        self.net.elect(root)

    @invariant()
    def one_owner_each(self) -> None:
        for name, (owner, _epoch, _home) in self.placed.items():
            masters = [s for s in SERVERS if self.net.queue(s, name).local]
            assert masters == ([owner] if owner is not None else []), (name, masters)


ClassicOwners.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=25, deadline=None
)
test_classic_owners_machine = ClassicOwners.TestCase
