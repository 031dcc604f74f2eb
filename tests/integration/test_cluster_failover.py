"""Shared queues when the root changes or the cluster loses its quorum.

Each test runs a cluster of its own (three primaries, sometimes a secondary),
kills, stops or demotes servers with real signals and ``brokerd ctl``, and
checks what the clients see: shared queues are replicated to every primary,
so no confirmed message is lost when the root is killed, what it had
delivered and not seen acked comes back flagged redelivered, consumers keep
receiving, and "blocked" really stops publishers.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingConnection

from tests.cluster_harness import Cluster
from tests.conftest import uid
from tests.support.eventually import eventually

# serial: its timing is measured against the heartbeat, so it runs alone
pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Plain links, or links over mutual TLS for the tests parametrised with
    ``WITH_TLS_LINKS``."""
    cluster = Cluster(
        tmp_path,
        primaries=3,
        secondaries=1,
        interval=0.3,
        timeout=1.5,
        open_timeout=3.0,
        tls=getattr(request, "param", "plain") == "tls",
    )
    try:
        cluster.start_all()
        cluster.wait_until(cluster.settled_root, timeout=30, what="a settled root")
        yield cluster
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.close()


#: the failovers that run again with links over mutual TLS
WITH_TLS_LINKS = pytest.mark.parametrize("cluster", ["plain", "tls"], indirect=True)


def connect(cluster: Cluster, index: int, **kwargs: object) -> BlockingConnection:
    return BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", cluster.ports[index], **kwargs)
    )


def roles(cluster: Cluster) -> tuple[int, list[int]]:
    root = cluster.index_of(cluster.settled_root())
    assert root is not None
    return root, [i for i in range(3) if i != root]


def publish_on_owner(
    cluster: Cluster, owner: int, queue: str, bodies: list[bytes], *, lag_root: int | None = None
) -> list[bytes]:
    """Declare durable ``queue`` through ``owner`` (client-local: it owns it) and publish
    ``bodies`` persistent, each confirmed. With ``lag_root``, that server is paused
    next and 300 more are confirmed by the owner and the other replica only: the
    root's copy lacks them. Every body confirmed, in order."""
    sent = list(bodies)
    with connect(cluster, owner) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        if lag_root is not None:
            cluster.pause(lag_root)
            for i in range(300):
                body = b"lagged-%03d:" % i + bytes([i % 256]) * (i % 900)
                ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
                sent.append(body)
    return sent


def kill_every_server(cluster: Cluster, root: int, a: int, b: int) -> None:
    """kill -9 of the secondary and the three primaries, the root last."""
    for index in (3, b, a, root):
        cluster.kill(index)


def drain(cluster: Cluster, index: int, queue: str) -> list[bytes]:
    """Every body left in ``queue``, got through server ``index``, in order."""
    with connect(cluster, index) as conn:
        ch = conn.channel()
        got = []
        while (m := ch.basic_get(queue, auto_ack=True))[0] is not None:
            got.append(m[2])
    return got


@WITH_TLS_LINKS
def test_consumers_elsewhere_keep_receiving_after_the_root_dies(cluster: Cluster) -> None:
    root, (a, b) = roles(cluster)
    queue = uid("survive")
    consumer = connect(cluster, a)
    try:
        ch = consumer.channel()
        ch.queue_declare(queue, durable=True)
        got: list[bytes] = []
        ch.basic_consume(queue, lambda c, m, p, body: got.append(body), auto_ack=True)
        with connect(cluster, b) as conn:
            pub = conn.channel()
            pub.confirm_delivery()
            pub.basic_publish("", queue, b"before")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            consumer.process_data_events(time_limit=0.05)
        assert got == [b"before"]

        old = cluster.spid(root)
        cluster.kill(root)
        cluster.wait_until(
            lambda: cluster.settled_root([a, b, 3]) not in (None, old),
            timeout=20,
            what="a new root",
        )
        # the queue's wiring survived on every primary; its consumer re-attached
        with connect(cluster, 3) as conn:
            pub = conn.channel()
            pub.confirm_delivery()
            pub.basic_publish("", queue, b"after")
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            consumer.process_data_events(time_limit=0.05)
        assert got == [b"before", b"after"]
    finally:
        consumer.close()


@WITH_TLS_LINKS
def test_no_confirmed_message_is_lost_when_the_root_is_killed(cluster: Cluster) -> None:
    """A confirmed stream of persistent messages through a non-root server while the
    root is killed (kill -9): every publish is acked or nacked, and every acked one
    is in the queue afterwards, at most once without the redelivered flag."""
    root, (a, _b) = roles(cluster)
    queue = uid("stream")
    outcomes: dict[int, str] = {}
    stop = threading.Event()
    kill_at: list[float] = []

    def publisher() -> None:
        conn = connect(cluster, a, blocked_connection_timeout=60)
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        n = 0
        while not stop.is_set() and n < 3000:
            n += 1
            try:
                ch.basic_publish("", queue, b"%d" % n, pika.BasicProperties(delivery_mode=2))
                outcomes[n] = "ack" if not kill_at else "ack-after"
            except pika.exceptions.NackError:
                outcomes[n] = "nack"
        conn.close()

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        time.sleep(1.0)
        kill_at.append(time.monotonic())
        cluster.kill(root)
        survivors = [i for i in range(4) if i != root]
        old = cluster.spid(root)
        cluster.wait_until(
            lambda: cluster.settled_root(survivors) not in (None, old), timeout=20, what="a root"
        )
        time.sleep(1.5)
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()
    assert outcomes and set(outcomes.values()) <= {"ack", "nack", "ack-after"}
    assert "ack-after" in outcomes.values(), "publishing never resumed after the failover"
    acked = {b"%d" % n for n, o in outcomes.items() if o != "nack"}
    got: list[bytes] = []
    unflagged: list[bytes] = []
    with connect(cluster, 3) as conn:
        ch = conn.channel()
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            got.append(body)
            if not method.redelivered:
                unflagged.append(body)
    lost = acked - set(got)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    # nacked ones may be there too (taken, then the ack died with the root). A forward
    # the dead root had not settled goes again to the new root, flagged redelivered
    # (the old root may have taken and replicated it): a second copy only flagged
    assert len(unflagged) == len(set(unflagged)), "a message twice without the flag"


def test_what_the_dead_root_delivered_unacked_comes_back_flagged(cluster: Cluster) -> None:
    root, (a, b) = roles(cluster)
    queue = uid("redeliver")
    with connect(cluster, root) as conn:  # client-local: the root owns it
        pub = conn.channel()
        pub.queue_declare(queue, durable=True)
        pub.confirm_delivery()
        for i in range(10):
            pub.basic_publish("", queue, b"%d" % i)
    consumer = connect(cluster, b)
    try:
        ch = consumer.channel()
        ch.basic_qos(prefetch_count=3)
        got: list[tuple[bytes, bool]] = []
        ch.basic_consume(queue, lambda c, m, p, body: got.append((body, m.redelivered)))
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            consumer.process_data_events(time_limit=0.05)
        assert got == [(b"0", False), (b"1", False), (b"2", False)]
        old = cluster.spid(root)
        cluster.kill(root)
        cluster.wait_until(
            lambda: cluster.settled_root([a, b, 3]) not in (None, old), timeout=20, what="a root"
        )
        # the consumer's server re-attached it to the new root, which had 0-2 as
        # delivered: they come back flagged (the client acks the stale tags: no-ops)
        ch.basic_ack(multiple=True, delivery_tag=3)
        deadline = time.monotonic() + 15
        while len(got) < 6 and time.monotonic() < deadline:
            consumer.process_data_events(time_limit=0.05)
        assert got[3:] == [(b"0", True), (b"1", True), (b"2", True)], got
    finally:
        consumer.close()


def test_quorum_loss_blocks_publishers_and_names_the_cause(cluster: Cluster) -> None:
    root, (a, b) = roles(cluster)
    queue = uid("blocked")
    blocked: list[str] = []
    conn = connect(cluster, 3, blocked_connection_timeout=60)
    conn.add_on_connection_blocked_callback(lambda c, frame: blocked.append(frame.method.reason))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"ready")
    for index in (root, a):
        cluster.kill(index)
    cluster.wait_until(
        lambda: (cluster.status(3) or {}).get("ready") is False, timeout=10, what="not ready"
    )
    conn.process_data_events(time_limit=0.5)  # connection.blocked arrives
    assert blocked and blocked[0].startswith("cluster not ready: "), blocked
    done: list[bool] = []

    def publish() -> None:
        ch.basic_publish("", queue, b"while-blocked")
        done.append(True)

    thread = threading.Thread(target=publish)
    thread.start()
    time.sleep(2.0)
    assert not done, "a publish was confirmed while the cluster had no root"
    # a new client waits in connection.open, then gets 541 naming the cause
    with pytest.raises(pika.exceptions.AMQPConnectionError) as info:
        connect(cluster, 3)
    assert "quorum lost" in repr(info.value)
    # back to a quorum: the blocked publish is read, taken by the new root, confirmed
    cluster.start(root)
    cluster.wait_until(lambda: cluster.settled_root([root, b, 3]), timeout=30, what="a root")
    thread.join(20)
    assert done == [True]
    conn.close()


def test_root_handover_keeps_messages_and_consumers(cluster: Cluster) -> None:
    root, (a, b) = roles(cluster)
    queue = uid("handover")
    consumer = connect(cluster, b)
    try:
        cch = consumer.channel()
        cch.queue_declare(queue, durable=True)
        with connect(cluster, a) as conn:
            pub = conn.channel()
            pub.confirm_delivery()
            for i in range(20):
                pub.basic_publish("", queue, b"%02d" % i)
        cluster.ctl(root, "root", "disable")
        new_root = cluster.wait_until(
            lambda: (r := cluster.settled_root()) and r != cluster.spid(root) and r,
            timeout=20,
            what="the hand-over",
        )
        assert new_root != cluster.spid(root)
        got: list[bytes] = []
        cch.basic_consume(queue, lambda c, m, p, body: got.append(body), auto_ack=True)
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            consumer.process_data_events(time_limit=0.05)
        assert got == [b"%02d" % i for i in range(20)]
    finally:
        consumer.close()


def test_replicas_journal_persistent_messages_a_restart_without_the_old_root_keeps_them(
    cluster: Cluster,
) -> None:
    """Confirmed persistent messages on a durable shared queue; every server is killed
    (kill -9); the two that were replicas restart without the old root: the one
    that becomes root serves every message from its own journal."""
    root, (a, b) = roles(cluster)
    queue = uid("journal")
    with connect(cluster, a) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("", queue, b"%03d" % i, pika.BasicProperties(delivery_mode=2))
    for index in (3, b, a, root):
        cluster.kill(index)
    cluster.start_all([a, b])
    cluster.wait_until(lambda: cluster.settled_root([a, b]), timeout=30, what="a root of two")
    got: list[bytes] = []
    with connect(cluster, b) as conn:
        ch = conn.channel()
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            got.append(body)
    assert got == [b"%03d" % i for i in range(200)]


@WITH_TLS_LINKS
def test_a_whole_cluster_restart_keeps_durable_shared_wiring_and_messages(
    cluster: Cluster,
) -> None:
    root, (a, b) = roles(cluster)
    queue = uid("restart")
    with connect(cluster, a) as conn:
        ch = conn.channel()
        ch.exchange_declare("rs-x", "topic", durable=True)
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, "rs-x", "k.#")
        ch.confirm_delivery()
        ch.basic_publish("rs-x", "k.1", b"kept", pika.BasicProperties(delivery_mode=2))
    for index in (3, b, a, root):
        cluster.kill(index)
    cluster.start_all([root, a, b])
    cluster.wait_until(cluster.settled_root, timeout=30, what="a root")
    with connect(cluster, b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("rs-x", "k.2", b"routed", pika.BasicProperties(delivery_mode=2))
        got = []
        while (m := ch.basic_get(queue, auto_ack=True))[0] is not None:
            got.append(m[2])
    assert got == [b"kept", b"routed"]


def test_a_whole_cluster_restart_gives_each_queue_back_to_its_last_owner(
    cluster: Cluster,
) -> None:
    """Confirmed while the root lagged (paused, under the timeout: the owner and the
    other replica are the majority), then every server killed: the root's copy
    lacks them. After the restart the queue is its last owner's again, whose copy
    has them, and waits for it while it is not back (it returns last here).
    Before the fix the root took every recovered queue with its own copy: 300 of
    the 350 confirmed messages were lost."""
    root, (a, b) = roles(cluster)
    queue = uid("lagged")
    before = [b"before-%03d" % i for i in range(50)]
    sent = publish_on_owner(cluster, a, queue, before, lag_root=root)  # a owns it
    kill_every_server(cluster, root, a, b)
    cluster.start_all([root, b])
    cluster.wait_until(cluster.settled_root, timeout=30, what="a root without a")
    for index in (root, b):  # nobody takes it while its last owner may come back
        assert queue not in cluster.ctl(index, "status")["owned_queues"]
    cluster.start(a)
    eventually(lambda: queue in cluster.ctl(a, "status")["owned_queues"], 15, "a owns it again")
    got = drain(cluster, b, queue)
    assert got == sent, (len(got), len(sent))


def test_a_whole_cluster_restart_without_the_last_owner_takes_the_most_complete_copy(
    cluster: Cluster,
) -> None:
    """As above, but the last owner never comes back (its disk is gone): after the
    cluster file's ``recovery_wait`` the queue goes to the copy that came back
    with the most, the other replica's (the owner and it confirmed the 300), not
    the root's, which lagged. Before, the first live primary took it, whatever
    its copy held: 50 of the 350 confirmed messages came back."""
    root, (a, b) = roles(cluster)
    queue = uid("orphan")
    before = [b"before-%03d" % i for i in range(50)]
    sent = publish_on_owner(cluster, a, queue, before, lag_root=root)  # a owns it
    kill_every_server(cluster, root, a, b)
    cluster.file.write_text("recovery_wait = 3\n" + cluster.file.read_text())
    cluster.start_all([root, b])  # a's disk is gone: it never returns
    cluster.wait_until(cluster.settled_root, timeout=30, what="a root without a")
    eventually(lambda: queue in cluster.ctl(b, "status")["owned_queues"], 20, "b's copy takes it")
    got = drain(cluster, root, queue)
    assert got == sent, (len(got), len(sent))


def test_a_whole_cluster_restart_led_by_a_server_that_lost_its_disk_keeps_every_queue(
    cluster: Cluster,
) -> None:
    """Every server killed; one of them, not the queue's owner, comes back with an
    empty disk (replaced, wiped) and starts first. It must not become root: the
    root seeds the cluster's state log from its own disk, and the others, syncing
    from an empty one, dropped every queue (before the fix: 404, 100 confirmed
    messages lost). A server that recovered the wiring is elected instead."""
    root, (a, b) = roles(cluster)
    queue = uid("kept")
    sent = publish_on_owner(cluster, a, queue, [b"kept-%03d" % i for i in range(100)])
    kill_every_server(cluster, root, a, b)
    wiped = b
    shutil.rmtree(cluster.nodes[wiped].home)
    for index in (wiped, root, a):  # the wiped one first: the most senior
        cluster.start(index)
    cluster.wait_until(cluster.settled_root, timeout=30, what="a root")
    assert cluster.root_index(10) != wiped
    eventually(lambda: queue in cluster.ctl(a, "status")["owned_queues"], 15, "a owns it")
    got = drain(cluster, wiped, queue)
    assert got == sent, (len(got), len(sent))


def test_a_last_owner_back_with_a_new_disk_does_not_get_its_queue_back_empty(
    cluster: Cluster,
) -> None:
    """Every server killed; the queue's last owner comes back at its address with an
    empty disk (replaced). It must not own the queue again: its empty copy would
    replace every other (the owner resets its replicas), and what it confirmed
    would be lost (before the fix: 0 of 100 came back). The most complete copy
    that came back takes it instead."""
    root, (a, b) = roles(cluster)
    queue = uid("rehomed")
    sent = publish_on_owner(cluster, a, queue, [b"rehomed-%03d" % i for i in range(100)])
    kill_every_server(cluster, root, a, b)
    shutil.rmtree(cluster.nodes[a].home)  # a's disk is replaced
    for index in (root, b, a):
        cluster.start(index)
    cluster.wait_until(cluster.settled_root, timeout=30, what="a root")

    def owner() -> int | None:
        owners = [i for i in (root, a, b) if queue in cluster.ctl(i, "status")["owned_queues"]]
        return owners[0] if owners else None

    eventually(lambda: owner() is not None, 20, "an owner for the queue")
    assert owner() != a
    got = drain(cluster, a, queue)
    assert got == sent, (len(got), len(sent))


def test_a_restarted_primary_syncs_a_deep_queue_while_publishers_go_on(
    cluster: Cluster,
) -> None:
    """Seed 001's live updates: a primary restarted (kill -9) behind a deep queue takes
    its snapshot from the back while following the live stream, so confirms go on
    meanwhile (its status says its copy is not whole until the snapshot is in);
    then it holds everything."""
    root, (a, b) = roles(cluster)
    queue = uid("deep")
    body = b"x" * 4096
    deep = 20_000  # 80 MiB, 40 snapshot chunks, partly paged out
    with connect(cluster, root) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        for i in range(deep):
            ch.basic_publish("", queue, body)
            if i % 2000 == 1999:  # a round trip now and then: a steady fill, not a flood
                ch.queue_declare(queue, passive=True)
        assert ch.queue_declare(queue, passive=True).method.message_count == deep
    confirmed: list[float] = []
    stop = threading.Event()

    def publish() -> None:
        with connect(cluster, a) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            while not stop.is_set():
                ch.basic_publish("", queue, b"live")  # returns once confirmed
                confirmed.append(time.monotonic())

    publisher = threading.Thread(target=publish, daemon=True)
    cluster.kill(b)
    publisher.start()
    cluster.start(b)
    syncing = complete = None
    deadline = time.monotonic() + 60
    try:
        while complete is None and time.monotonic() < deadline:
            replication = (cluster.status(b, timeout=2.0) or {}).get("copies") or {}
            now = time.monotonic()
            if replication.get("source") == cluster.spid(root):
                if not replication["complete"]:
                    syncing = syncing or now
                else:
                    complete = now
            time.sleep(0.005)
    finally:
        stop.set()
        publisher.join(10)
    assert syncing is not None and complete is not None, (syncing, complete)
    during = [t for t in confirmed if syncing < t < complete]
    assert during, f"no confirm in the {complete - syncing:.3f} s of the snapshot"

    def copies() -> bool:
        view = cluster.status(b, timeout=2.0) or {}
        held = view["copies"]["queues"].get(queue, {}).get("messages", -1)
        return held == deep + len(confirmed)

    cluster.wait_until(copies, timeout=10, what="the whole copy")
