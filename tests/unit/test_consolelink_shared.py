"""What a clustered broker tells the console about shared objects (docs/protocol.md,
"Broker to console"): who holds a shared queue's messages, where its consumers are,
and which servers hold a copy, in sync or not (also as ``brokerd ctl queues`` and the
state dump show them).

Three servers with real planes and queues on the in-memory network of
tests/unit/cluster_net.py; A is root.
"""

from __future__ import annotations

from brokerd.cluster.queues.shared import RemoteQueues
from brokerd.consolelink.tracker import SnapshotTracker, collect
from brokerd.ctl.text import _replica_text
from brokerd.server.dump import _placement, queue_table
from tests.unit.cluster_net import Net, Sink, message


def entry(net: Net, spid: str, name: str = "q") -> dict:
    return collect(net.servers[spid].broker, "/", spid)["queues"][("/", name)]


def consume(net: Net, spid: str, tag: str) -> Sink:
    sink = Sink(tag)
    answers: list[object] = []
    net.queue(spid, "q").add_consumer(sink, answers.append)
    net.pump()
    assert answers == [None], answers
    return sink


def test_the_root_masters_a_shared_queue_and_counts_consumers_per_server(net: Net) -> None:
    for i in range(3):
        net.queue("B", "q").push(message(b"%d" % i))
    net.pump()
    consume(net, "B", "b1")
    consume(net, "B", "b2")
    consume(net, "C", "c1")
    consume(net, "A", "a1")

    root = entry(net, "A")
    assert (root["shared"], root["master"]) == (True, True)
    assert root["consumers"] == 4
    assert root["consumer_servers"] == {"A": 1, "B": 2, "C": 1}

    proxy = entry(net, "B")
    assert (proxy["shared"], proxy["master"]) == (True, False)
    assert proxy["messages"] == 0  # the messages are on the root
    assert proxy["consumers"] == 2  # B's own
    assert "consumer_servers" not in proxy
    assert entry(net, "C")["consumers"] == 1


def test_a_move_moves_the_master_flag_and_the_consumer_spread(net: Net) -> None:
    consume(net, "C", "c1")
    assert entry(net, "A")["consumer_servers"] == {"C": 1}
    net.place("q", "B")
    net.pump()
    assert entry(net, "A")["master"] is False
    new_root = entry(net, "B")
    assert new_root["master"] is True
    assert new_root["consumer_servers"] == {"C": 1}  # C attached again at the new root


def test_private_queues_are_masters_without_a_consumer_spread(net: Net) -> None:
    vhost = net.servers["B"].broker.vhosts["/"]
    vhost.declare_queue("mine", connection_id=7, exclusive=True)
    private = entry(net, "B", "mine")
    assert (private["shared"], private["master"]) == (False, True)
    assert "consumer_servers" not in private
    # a standalone broker (no cluster vhost) shares nothing
    assert collect(net.servers["B"].broker)["queues"][("/", "q")]["shared"] is False


def test_wiring_is_shared_except_bindings_of_private_queues_and_stand_ins(net: Net) -> None:
    broker = net.servers["B"].broker
    vhost = broker.vhosts["/"]
    exchange, _ = vhost.declare_exchange("x", "direct")
    own, _ = vhost.declare_queue("mine", connection_id=7, exclusive=True)
    vhost.bind(exchange, net.queue("B", "q"), "to-shared")
    vhost.bind(exchange, own, "to-private")
    # A's private queue as B binds it (a meta-binding): A reports that binding, not B
    vhost.bind(exchange, RemoteQueues(net.servers["B"].queues).get("A", "theirs"), "to-theirs")

    snap = collect(broker, "/", "B")
    assert snap["exchanges"][("/", "x")]["shared"] is True
    bindings = {key[4]: b for key, b in snap["bindings"].items() if key[1] == "x"}
    assert set(bindings) == {"to-shared", "to-private"}
    assert bindings["to-shared"]["shared"] is True
    assert bindings["to-private"]["shared"] is False
    assert bindings["to-private"]["destination_type"] == "queue"


def test_deltas_carry_a_master_whose_consumer_spread_changed(net: Net) -> None:
    tracker = SnapshotTracker()
    tracker.next(collect(net.servers["A"].broker, "/", "A"))
    consume(net, "C", "c1")
    full, body = tracker.next(collect(net.servers["A"].broker, "/", "A"))
    assert not full
    [changed] = body["queues"]["upsert"]
    assert changed["consumer_servers"] == {"C": 1}
    # nothing changed since: an empty delta
    _, body = tracker.next(collect(net.servers["A"].broker, "/", "A"))
    assert body["queues"] == {"upsert": [], "remove": []}


def test_a_replicated_master_reports_its_replicas_a_classic_one_none(net: Net) -> None:
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    assert entry(net, "A")["replicas"] == [
        {"spid": "B", "in_sync": True, "behind": 0},
        {"spid": "C", "in_sync": True, "behind": 0},
    ]
    assert "replicas" not in entry(net, "B")  # a proxy: its master reports them
    vhost = net.servers["A"].broker.vhosts["/"]
    vhost.declare_queue("mine", connection_id=7, exclusive=True)
    assert "replicas" not in entry(net, "A", "mine")  # private: no copies
    for server in net.servers.values():  # a classic queue owned by B: its own alone
        server.broker.vhosts["/"].declare_queue(
            "c", connection_id=0, durable=True, arguments={"x-queue-type": "classic"}
        )
        server.broker.vhosts["/"].queues["c"].place("B", 1, None)  # type: ignore[attr-defined]
    net.pump()
    assert entry(net, "B", "c")["replicas"] == []
    assert "replicas" not in entry(net, "A", "c")


def test_deltas_carry_a_master_whose_replica_fell_out_of_sync(net: Net) -> None:
    tracker = SnapshotTracker()
    tracker.next(collect(net.servers["A"].broker, "/", "A"))
    net.cut.add(("C", "A"))  # C's acks stop coming back
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    net.servers["A"].members.now += 10
    net.servers["A"].queues.tick()  # C stalled: the replication alarm
    _, body = tracker.next(collect(net.servers["A"].broker, "/", "A"))
    [changed] = body["queues"]["upsert"]
    replicas = {r["spid"]: r for r in changed["replicas"]}
    assert (replicas["B"]["in_sync"], replicas["C"]["in_sync"]) == (True, False)
    assert replicas["C"]["behind"] >= 1


def test_ctl_queues_and_the_dump_show_the_replicas_in_sync(net: Net) -> None:
    net.cut.add(("C", "A"))
    net.queue("A", "q").push(message(b"m"))
    net.pump()
    net.servers["A"].members.now += 10
    net.servers["A"].queues.tick()

    class Server:  # what queue_table reads of the server
        spid = "A"
        broker = net.servers["A"].broker

    [row] = queue_table(Server())  # type: ignore[arg-type]
    assert row["role"] == "master"
    assert [(r["spid"], r["in_sync"]) for r in row["replicas"]] == [("B", True), ("C", False)]
    assert _replica_text(row["replicas"]) == "1/2 in sync (syncing: C)"
    assert _replica_text(None) == "-"
    line = _placement(net.queue("A", "q"))
    assert line.endswith(" role=master replicas=B:in-sync:0,C:syncing:1"), line
    assert "replicas=" not in _placement(net.queue("B", "q"))  # a proxy does not know


def test_an_in_sync_replicas_lag_stays_out_of_the_queue_entry() -> None:
    """The root's stream moves with any traffic: an entry that carried an in-sync
    replica's lag would change, and be sent, at every status while messages flow."""
    from brokerd.consolelink.tracker import queue_entry

    class Replicated:
        vhost, name, durable, exclusive, auto_delete = "/", "q", True, False, False
        message_count, unacked, consumers, stats_in, stats_out = 0, 0, [], 0, 0
        arguments: dict[str, object] = {}
        local = True
        kind = "replicated"

        def replica_states(self) -> list[dict[str, object]]:
            return [
                {"spid": "B", "in_sync": True, "behind": 37},
                {"spid": "C", "in_sync": False, "behind": 1200},
            ]

    entry = queue_entry(Replicated(), True, "A")  # type: ignore[arg-type]
    assert entry["replicas"] == [
        {"spid": "B", "in_sync": True, "behind": 0},
        {"spid": "C", "in_sync": False, "behind": 1200},
    ]
