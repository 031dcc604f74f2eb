"""The queue-type interface: the model's queue and a shared queue's two roles all
implement it, and a shared queue hands every call to the role it holds."""

from __future__ import annotations

from brokerd.cluster.queues.roles import Owner, Proxy
from brokerd.model.interfaces import QueueType
from brokerd.model.queue import Queue
from tests.unit.cluster_net import Net, Sink, Waiter, message


def test_the_local_queue_and_both_roles_are_queue_types(net: Net) -> None:
    shared = net.queue("A", "q")
    assert isinstance(Queue("local", "/"), QueueType)
    assert isinstance(shared, QueueType)
    assert isinstance(Owner(shared, shared.inner), QueueType)
    assert isinstance(Proxy(shared, shared.inner), QueueType)
    assert not isinstance(shared, Queue)  # it holds one (``inner``), it is none


def test_a_shared_queue_serves_as_owner_on_the_root_and_as_proxy_elsewhere(net: Net) -> None:
    owner, proxy = net.queue("A", "q"), net.queue("B", "q")
    assert isinstance(owner.role, Owner) and owner.local
    assert isinstance(proxy.role, Proxy) and not proxy.local
    waiter = Waiter()
    assert proxy.push(message(b"through B"), waiter)  # forwarded to the owner
    net.pump()
    assert waiter.answers == [(True, 1)]
    assert [m.body for m, _ in owner.ready()] == [b"through B"]
    sink = Sink("c")
    proxy.add_consumer(sink, lambda error: None)
    net.pump()
    assert sink.bodies() == [b"through B"]  # delivered by the owner, through B


def test_a_move_swaps_the_roles_and_the_object_stays(net: Net) -> None:
    before_a, before_b = net.queue("A", "q"), net.queue("B", "q")
    before_a.push(message(b"kept"))
    net.pump()
    net.place("q", "B")
    assert net.queue("B", "q") is before_b and before_b.local
    assert isinstance(before_b.role, Owner) and isinstance(before_a.role, Proxy)
    assert [m.body for m, _ in before_b.ready()] == [b"kept"]
