"""A peer's records naming a queue this server has not applied yet wait for the root's
barrier (``queues.catchup``): the in-memory plane (tests/unit/cluster_net.py), with
the barrier answered by the test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues import catchup
from brokerd.model.message import Message
from tests.unit.cluster_net import Net, Sink, Waiter


class Root:
    """The wiring's barrier as C's catch-up sees it: the test answers each question."""

    def __init__(self, reachable: bool = True) -> None:
        self.reachable = reachable
        self.questions: list[Callable[[], None]] = []

    def __call__(self, resume: Callable[[], None]) -> bool:
        if not self.reachable:
            return False
        self.questions.append(resume)
        return True

    def answer(self) -> None:
        self.questions.pop(0)()


@pytest.fixture
def root(net: Net) -> Root:
    barrier = Root()
    net.servers["C"].queues.catch_up.barrier = barrier
    return barrier


def declared(net: Net, name: str, servers: tuple[str, ...], owner: str = "C") -> None:
    """The root's declare of ``name`` (placed on ``owner``) as applied by ``servers``
    so far: the others have not heard of it yet."""
    net.log_seq += 1
    for spid in servers:
        net.servers[spid].broker.vhosts["/"].declare_queue(name, connection_id=0)
        net.queue(spid, name).place(owner, 1, None, net.log_seq)


def publish(net: Net, spid: str, queue: str, body: bytes) -> Waiter:
    waiter = Waiter()
    assert net.queue(spid, queue).push(Message("", queue, b"", body, 1, 1), waiter)
    return waiter


def bodies(net: Net, spid: str, queue: str) -> list[bytes]:
    return [m.body for m in net.queue(spid, queue).inner.messages]


def test_a_forward_for_a_queue_the_owner_has_not_applied_waits_for_the_barrier(
    net: Net, root: Root
) -> None:
    declared(net, "fresh", ("A", "B"))
    waiter = publish(net, "B", "fresh", b"m1")
    net.pump()
    assert waiter.answers == []  # not "unroutable": C asked the root first
    assert len(root.questions) == 1
    declared(net, "fresh", ("C",), "C")  # the root's word reaches C
    root.answer()
    net.pump()
    assert waiter.answers == [(True, 1)]
    assert bodies(net, "C", "fresh") == [b"m1"]


def test_without_a_root_to_ask_a_missing_queue_is_not_routed_at_once(net: Net) -> None:
    net.servers["C"].queues.catch_up.barrier = Root(reachable=False)
    declared(net, "fresh", ("A", "B"))
    waiter = publish(net, "B", "fresh", b"m1")
    net.pump()
    assert waiter.answers == [(True, 0)]  # settled, routed nowhere (a mandatory return)


def test_what_the_peer_sends_after_a_held_record_waits_behind_it_in_order(
    net: Net, root: Root
) -> None:
    declared(net, "here", ("A", "B", "C"))
    declared(net, "fresh", ("A", "B"))
    first = publish(net, "B", "fresh", b"m1")
    second = publish(net, "B", "here", b"m2")
    net.pump()
    assert first.answers == second.answers == []
    assert bodies(net, "C", "here") == []  # behind the held one
    other = publish(net, "A", "here", b"from A")
    net.pump()
    assert other.answers == [(True, 1)]  # another peer's records do not wait
    declared(net, "fresh", ("C",))
    root.answer()
    net.pump()
    assert first.answers == [(True, 1)] and second.answers == [(True, 1)]
    assert bodies(net, "C", "here") == [b"from A", b"m2"]
    assert net.servers["C"].queues.catch_up.held == {}


def test_a_queue_still_missing_after_the_barrier_is_not_routed(net: Net, root: Root) -> None:
    declared(net, "gone", ("A", "B"))
    waiter = publish(net, "B", "gone", b"m1")
    net.pump()
    root.answer()  # the root ordered nothing more: C has everything there is
    net.pump()
    assert waiter.answers == [(True, 0)]
    assert root.questions == []


def test_a_record_received_after_the_question_waits_for_a_new_barrier(net: Net, root: Root) -> None:
    """A barrier covers what was ordered before the root answered it; a record that
    came after it was asked may name a queue ordered later still."""
    declared(net, "first", ("A", "B"))
    one = publish(net, "B", "first", b"m1")
    net.pump()
    declared(net, "second", ("A", "B"))
    two = publish(net, "B", "second", b"m2")
    net.pump()
    assert len(root.questions) == 1
    declared(net, "first", ("C",))
    root.answer()
    net.pump()
    assert one.answers == [(True, 1)]
    assert two.answers == []  # "second" is still not on C: a second question
    assert len(root.questions) == 1
    declared(net, "second", ("C",))
    root.answer()
    net.pump()
    assert two.answers == [(True, 1)]
    assert bodies(net, "C", "second") == [b"m2"]


def test_a_consume_for_a_queue_the_owner_has_not_applied_waits_for_the_barrier(
    net: Net, root: Root
) -> None:
    declared(net, "fresh", ("A", "B"))
    answers: list[object] = []
    sink = Sink("c1", prefetch=5)
    net.queue("B", "fresh").add_consumer(sink, answers.append)
    net.pump()
    assert answers == []  # not a 404: C asked the root first
    declared(net, "fresh", ("C",))
    root.answer()
    net.pump()
    assert answers == [None]
    net.queue("C", "fresh").push(Message("", "fresh", b"", b"hello", 1, 1))
    net.pump()
    assert sink.bodies() == [b"hello"]


def test_held_records_go_with_their_session(net: Net, root: Root) -> None:
    declared(net, "fresh", ("A", "B"))
    publish(net, "B", "fresh", b"m1")
    net.pump()
    assert "B" in net.servers["C"].queues.catch_up.held
    net.drop_link("B", "C")
    assert net.servers["C"].queues.catch_up.held == {}
    declared(net, "fresh", ("C",))
    root.answer()
    net.pump()
    assert bodies(net, "C", "fresh") == []  # the sender keeps or nacks it, as for a cut


def test_a_barrier_the_root_does_not_answer_is_given_up_on(net: Net, root: Root) -> None:
    declared(net, "fresh", ("A", "B"))
    waiter = publish(net, "B", "fresh", b"m1")
    net.pump()
    net.tick(catchup.WAIT / 2)
    assert waiter.answers == []
    net.tick(catchup.WAIT)
    assert waiter.answers == [(True, 0)]
    root.answer()  # late: changes nothing
    net.pump()
    assert waiter.answers == [(True, 0)]


class _Out:
    def __init__(self, spid: str) -> None:
        self.spid = spid


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("receive"), st.sampled_from("PQ"), st.sampled_from("xyz")),
            st.tuples(st.just("declare"), st.sampled_from("xyz")),
            st.tuples(st.just("answer")),
            st.tuples(st.just("drop"), st.sampled_from("PQ")),
            st.tuples(st.just("tick")),
        ),
        max_size=40,
    )
)
def test_records_are_taken_once_in_their_peers_order_and_never_before_a_covering_barrier(
    actions: list[tuple[str, ...]],
) -> None:
    """Whatever arrives, is declared, answered, dropped or timed out: each peer's
    records are taken in the order they came, at most once (all of them unless
    their session was dropped); one naming a queue missing when it came is taken
    only once the queue is here or a barrier asked after it came was answered."""
    present: set[str] = set()
    now = [0.0]
    keeper = catchup.CatchUp(lambda: "C", lambda: present, lambda: now[0])
    questions: list[tuple[int, Callable[[], None]]] = []
    asked = [0]

    def barrier(resume: Callable[[], None]) -> bool:
        asked[0] += 1
        questions.append((asked[0], resume))
        return True

    keeper.barrier = barrier
    taken: dict[str, list[int]] = {"P": [], "Q": []}
    sent: dict[str, list[int]] = {"P": [], "Q": []}
    answered = [0]  # the last barrier answered or given up on
    arrivals: dict[int, tuple[str, int]] = {}  # record -> (queue, barriers asked before)
    dropped: dict[str, set[int]] = {"P": set(), "Q": set()}

    def handler(out: Any, r: rec.Get) -> None:
        number = r.req
        queue, asked_before = arrivals[number]
        assert queue in present or answered[0] > asked_before, "taken before its barrier"
        taken[out.spid].append(number)

    for number, action in enumerate(actions):
        if action[0] == "receive":
            peer, queue = action[1], action[2]
            arrivals[number] = (queue, asked[0])
            sent[peer].append(number)
            record = rec.Get(req=number, queue=queue, no_ack=True)
            keeper.receive(_Out(peer), record, handler)  # type: ignore[arg-type]
        elif action[0] == "declare":
            present.add(action[1])
        elif action[0] == "answer" and questions:
            number_asked, resume = questions.pop(0)
            answered[0] = max(answered[0], number_asked)
            resume()
        elif action[0] == "drop":
            dropped[action[1]].update(sent[action[1]])
            keeper.drop(action[1])
        elif action[0] == "tick":
            now[0] += catchup.WAIT + 1
            answered[0] = asked[0]  # given up on: as if answered
            keeper.tick()
    for peer in "PQ":
        assert taken[peer] == sorted(taken[peer])  # in order
        assert len(set(taken[peer])) == len(taken[peer])  # once
        if not keeper.held.get(peer):
            # all taken but what a drop took with it
            assert set(taken[peer]) | dropped[peer] == set(sent[peer])
