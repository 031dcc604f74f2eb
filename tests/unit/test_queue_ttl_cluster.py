"""TTL, x-expires and dead-lettering on a cluster's shared queues: they act on the
master only, and what they remove reaches the replicas as settlements."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from brokerd.model.queue import Queue
from tests.unit.cluster_net import Net, Sink, Waiter, message
from tests.unit.queue_support import FakeTimers


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTimers]:
    fake = FakeTimers()
    monkeypatch.setattr(Queue, "timers", fake)
    yield fake


def declare(net: Net, name: str, **arguments: Any) -> None:
    for server in net.servers.values():
        server.broker.vhosts["/"].declare_queue(name, connection_id=0, arguments=arguments)
    net.place(name, net.root)  # type: ignore[arg-type]
    net.pump()


def cluster() -> Net:
    net = Net()
    for spid in ("A", "B", "C"):
        net.add(spid)
    net.elect("A")
    return net


def replica_bodies(net: Net, spid: str, name: str) -> list[bytes]:
    replica = net.servers[spid].queues.copies.queues[name]
    return [e.message.body for e in replica.entries.values()]


def test_ttl_runs_on_the_master_and_replicas_see_the_expiry(timers: FakeTimers) -> None:
    net = cluster()
    declare(net, "q", **{"x-message-ttl": 1000})
    net.queue("B", "q").push(message(b"m"), Waiter())  # through a proxy
    net.pump()
    master = net.queue("A", "q")
    assert master.message_count == 1
    assert replica_bodies(net, "B", "q") == [b"m"] == replica_bodies(net, "C", "q")
    assert len(timers.pending) == 1  # the master's; proxies set none
    timers.advance(1.1)
    net.pump()
    assert master.message_count == 0 and master.stats_expired == 1
    assert replica_bodies(net, "B", "q") == [] == replica_bodies(net, "C", "q")


def test_a_promoted_master_takes_over_the_timers(timers: FakeTimers) -> None:
    net = cluster()
    declare(net, "q", **{"x-message-ttl": 1000, "x-expires": 60_000})
    net.queue("A", "q").push(message(b"m"), Waiter())
    net.pump()
    net.kill("A")  # B is root now, from its replica
    promoted = net.queue("B", "q")
    assert promoted.local and promoted.message_count == 1
    timers.advance(1.1)  # the TTL counts again from the promotion
    net.pump()
    assert promoted.message_count == 0
    assert replica_bodies(net, "C", "q") == []


def test_a_demoted_master_stops_its_timers(timers: FakeTimers) -> None:
    net = cluster()
    declare(net, "q", **{"x-message-ttl": 1000})
    net.queue("A", "q").push(message(b"m"), Waiter())
    net.pump()
    net.place("q", "B")  # moved
    old = net.queue("A", "q")
    assert not old.local and old.message_count == 0
    assert [h for h in timers.pending if h.callback.__self__ is old] == []  # type: ignore[attr-defined]


def test_x_expires_on_a_shared_queue_goes_through_on_unused(timers: FakeTimers) -> None:
    net = cluster()
    declare(net, "q", **{"x-expires": 1000})
    ordered: list[str] = []
    for server in net.servers.values():  # the controller orders a cluster-wide delete
        server.broker.vhosts["/"].queues["q"].on_unused = lambda q: ordered.append(q.name)
    timers.advance(1.1)
    assert ordered == ["q"]  # once: the master's timer, none on the proxies


def test_a_reject_through_a_proxy_dead_letters_on_the_master(timers: FakeTimers) -> None:
    net = cluster()
    declare(net, "dead")
    declare(net, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    net.queue("B", "q").push(message(b"m"), Waiter())
    net.pump()
    got: list = []
    net.queue("C", "q").get(False, got.append)
    net.pump()
    net.queue("C", "q").reject([got[0][0]])
    net.pump()
    assert [m.body for m, _ in net.queue("A", "dead").ready()] == [b"m"]
    assert replica_bodies(net, "B", "dead") == [b"m"]
    assert replica_bodies(net, "B", "q") == []


def test_x_expires_counts_again_when_a_servers_consumers_are_released(
    timers: FakeTimers,
) -> None:
    net = cluster()
    declare(net, "q", **{"x-expires": 1000})
    ordered: list[str] = []
    net.queue("A", "q").on_unused = lambda q: ordered.append(q.name)
    net.queue("B", "q").add_consumer(Sink("c"))  # attached at the root as a remote one
    net.pump()
    assert net.queue("A", "q").consumers
    timers.advance(5)
    assert ordered == []  # in use
    net.kill("B")  # the root releases B's consumers: the count starts
    timers.advance(0.9)
    assert ordered == []
    timers.advance(0.2)
    assert ordered == ["q"]
