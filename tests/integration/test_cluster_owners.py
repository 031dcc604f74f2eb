"""Classic shared queues live on an owner of their own, not on the root (issue 23).

Real brokerd processes on loopback (three primaries and a secondary) and pika.
A queue declared with ``x-queue-type: classic`` is placed by the root on the
declaring primary (RabbitMQ's ``client-local``) or on the primary owning the
fewest (``x-queue-master-locator: min-masters``); it is mastered there, and
publishes and consumers on other servers go straight to it. Owner loss and
return are in ``test_cluster_owner_loss.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import ChannelClosedByBroker

from tests.cluster_harness import Cluster
from tests.conftest import uid
from tests.support.eventually import eventually
from tests.support.roles import Roles, settled

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

CLASSIC = {"x-queue-type": "classic"}


class Servers(Roles):
    def sent(self, index: int, to: int) -> int:
        """Bytes server ``index`` sent on its data lane to server ``to``."""
        lanes = self.status(index)["lanes"]
        return int(lanes[self.cluster.spid(to)].get("sent", 0))


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with settled(tmp_path_factory.mktemp("owners")) as roles:
        yield Servers(**vars(roles))


def consume(conn: BlockingConnection, queue: str, count: int, timeout: float = 15.0) -> list[bytes]:
    """``count`` bodies from ``queue``, acked, in the order they came."""
    got: list[bytes] = []
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)

    def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
        got.append(body)
        channel.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message)
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


def test_a_classic_queue_is_owned_where_it_was_declared_and_its_traffic_skips_the_root(
    servers: Servers,
) -> None:
    queue = uid("classic")
    with servers.connect(servers.a) as conn:
        conn.channel().queue_declare(queue, arguments=CLASSIC)
    eventually(lambda: servers.owner(queue) == servers.a, 10, f"{queue} owned by a")
    # brokerd ctl queues: the same owner seen from every server, master on it alone
    for index in (servers.root, servers.a, servers.b, servers.s):
        listed = servers.cluster.ctl(index, "queues")
        [row] = [q for q in listed["queues"] if q["name"] == queue]
        assert (row["type"], row["owner"]) == ("classic", servers.cluster.spid(servers.a))
        assert row["role"] == ("master" if index == servers.a else "proxy")

    bodies = [(b"%05d|" % i) + bytes([i % 251]) * 10_000 for i in range(200)]
    via_root = servers.sent(servers.b, servers.root)
    direct = servers.sent(servers.b, servers.a)
    with servers.connect(servers.b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body)  # raises if nacked
    # 2 MB went from b to a, not through the root
    assert servers.sent(servers.b, servers.a) - direct >= 2_000_000
    assert servers.sent(servers.b, servers.root) - via_root < 200_000
    assert {servers.depth(i, queue) for i in (servers.root, servers.a, servers.b, servers.s)} == {
        (200, 0)
    }
    # consumers on the secondary and on the root attach to the owner, byte for byte
    with servers.connect(servers.s) as conn:
        first = consume(conn, queue, 120)
    with servers.connect(servers.root) as conn:  # (the first may have taken a few more)
        rest = consume(conn, queue, len(bodies) - len(first))
    assert first + rest == bodies
    assert servers.depth(servers.b, queue) == (0, 0)


def test_get_purge_and_counts_are_answered_by_the_owner(servers: Servers) -> None:
    queue = uid("classic-get")
    with servers.connect(servers.b) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, arguments=CLASSIC)
        ch.confirm_delivery()
        for i in range(10):
            ch.basic_publish("", queue, b"m%d" % i)
    eventually(lambda: servers.owner(queue) == servers.b, 10, f"{queue} owned by b")
    with servers.connect(servers.a) as conn:
        ch = conn.channel()
        method, _props, body = ch.basic_get(queue)
        assert body == b"m0" and method is not None
        ch.basic_reject(method.delivery_tag, requeue=True)
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"m0" and method.redelivered
        assert ch.queue_declare(queue, passive=True).method.message_count == 9
        assert ch.queue_purge(queue).method.message_count == 9
    assert servers.depth(servers.root, queue) == (0, 0)


def test_min_masters_and_a_secondary_place_on_the_primary_owning_fewest(
    servers: Servers,
) -> None:
    for declaring, arguments in [
        (servers.s, {**CLASSIC, "x-queue-master-locator": "min-masters"}),
        (servers.root, {**CLASSIC, "x-queue-master-locator": "min-masters"}),
        (servers.s, CLASSIC),  # client-local on a secondary: a primary, the least loaded
        (servers.a, {**CLASSIC, "x-queue-master-locator": "min-masters"}),
    ]:
        owned = {i: len(servers.status(i)["owned_queues"]) for i in servers.primaries}
        name = uid("spread")
        with servers.connect(declaring) as conn:
            conn.channel().queue_declare(name, arguments=arguments)
        eventually(lambda n=name: servers.owner(n) is not None, 10, f"{name} owned")
        assert owned[servers.owner(name)] == min(owned.values()), (owned, servers.owner(name))


def test_a_fanned_out_publish_reaches_queues_on_every_owner_once(servers: Servers) -> None:
    exchange = uid("fan")
    on_a, on_b, replicated = uid("on-a"), uid("on-b"), uid("replicated")
    with servers.connect(servers.a) as conn:
        conn.channel().queue_declare(on_a, arguments=CLASSIC)
    with servers.connect(servers.b) as conn:
        conn.channel().queue_declare(on_b, arguments=CLASSIC)
    with servers.connect(servers.s) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout")
        ch.queue_declare(replicated)
        for queue in (on_a, on_b, replicated):
            ch.queue_bind(queue, exchange)
        ch.confirm_delivery()
        for i in range(50):
            ch.basic_publish(exchange, "", b"f%d" % i, mandatory=True)
    expected = [b"f%d" % i for i in range(50)]
    for queue in (on_a, on_b, replicated):
        with servers.connect(servers.root) as conn:
            assert consume(conn, queue, 50) == expected, queue


def test_an_auto_delete_classic_queue_owned_off_the_root_goes_with_its_last_consumer(
    servers: Servers,
) -> None:
    queue = uid("classic-ad")
    with servers.connect(servers.a) as conn:
        conn.channel().queue_declare(queue, auto_delete=True, arguments=CLASSIC)
        eventually(lambda: servers.owner(queue) == servers.a, 10, f"{queue} owned by a")
        with servers.connect(servers.b) as consumer:
            ch = consumer.channel()
            tag = ch.basic_consume(queue, lambda *args: None)
            assert servers.depth(servers.root, queue) == (0, 1)
            ch.basic_cancel(tag)

    def gone_everywhere() -> bool:
        for index in (servers.root, servers.a, servers.b, servers.s):
            try:
                servers.depth(index, queue)
            except ChannelClosedByBroker as exc:
                assert exc.reply_code == 404
                continue
            return False
        return True

    eventually(gone_everywhere, 10, f"{queue} deleted on every server")


def test_the_cluster_files_leader_locator_places_declares_that_name_none(
    tmp_path: Any,
) -> None:
    """``queue_leader_locator = "balanced"`` in the cluster file: queues declared
    through one primary without a locator spread over the primaries, as RabbitMQ's
    ``queue_leader_locator`` setting does; one naming ``client-local`` stays put.
    Before the setting, all three went to the declaring primary."""
    cluster = Cluster(tmp_path, primaries=3, interval=0.5, timeout=2.5)
    cluster.file.write_text('queue_leader_locator = "balanced"\n' + cluster.file.read_text())
    try:
        root = cluster.start_settled()
        servers = Servers.of(cluster, root)
        names = [uid("balanced") for _ in range(3)]
        with servers.connect(servers.a) as conn:
            ch = conn.channel()
            for name in names:  # classic and durable replicated alike
                ch.queue_declare(name, durable=name != names[0], arguments=None)
            local = uid("local")
            # an untyped queue's arguments are a classic queue's (RabbitMQ's check)
            ch.queue_declare(
                local, durable=True, arguments={"x-queue-master-locator": "client-local"}
            )
        for name in [*names, local]:
            eventually(lambda n=name: servers.owner(n) is not None, 10, f"{name} owned")
        assert sorted(servers.owner(n) for n in names) == sorted(servers.primaries)
        assert servers.owner(local) == servers.a
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.close()


def test_wiring_through_a_server_that_has_not_heard_of_an_auto_delete_yet(
    servers: Servers,
) -> None:
    """Issue 44: an auto-delete queue owned off the root loses its last consumer, and
    its owner drops it at once; the root's ordered delete reaches the other servers
    later (here: the root is paused for 0.8 s). Through the secondary, whose proxy of
    the queue is stale meanwhile, a delete answers delete-ok (as for any missing
    queue), a passive declare 404, and a declare makes the queue anew, as a single
    broker would; before the fix the delete and the declare got the owner's 404."""
    queue, again = uid("ad-delete"), uid("ad-declare")
    with servers.connect(servers.a) as conn:
        ch = conn.channel()
        for name in (queue, again):
            ch.queue_declare(name, auto_delete=True, arguments=CLASSIC)
    for name in (queue, again):
        eventually(lambda n=name: servers.owner(n) == servers.a, 10, f"{name} owned by a")
    with servers.connect(servers.s) as conn:
        ch = conn.channel()
        tags = [ch.basic_consume(name, lambda *args: None) for name in (queue, again)]
        eventually(lambda: servers.depth(servers.a, again) == (0, 1), 10, "consumer on a")
        servers.cluster.pause(servers.root)
        try:
            for tag in tags:
                ch.basic_cancel(tag)  # the owner drops both; the root hears nothing yet
            stale = [q["name"] for q in servers.cluster.ctl(servers.s, "queues")["queues"]]
            assert queue in stale and again in stale, "the secondary still proxies them"
            threading.Timer(0.8, servers.cluster.resume, (servers.root,)).start()
            ok = ch.queue_declare(again, auto_delete=True, arguments=CLASSIC)
            assert (ok.method.message_count, ok.method.consumer_count) == (0, 0)
            assert ch.queue_delete(queue).method.message_count == 0
        finally:
            servers.cluster.resume(servers.root)
        with pytest.raises(ChannelClosedByBroker) as passive:
            conn.channel().queue_declare(queue, passive=True)
        assert passive.value.reply_code == 404
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", again, b"still here")  # raises if nacked or unroutable
        assert ch.queue_declare(again, passive=True).method.message_count == 1
        ch.queue_delete(again)


def test_no_client_may_use_the_clusters_internal_names(servers: Servers) -> None:
    """Issue 46: ``exchange.bind(destination="amq.rookery.cluster", source=X)`` was
    accepted and replicated, and every publish to X then closed its channel with 403.
    Every method that names an exchange or queue refuses ``amq.rookery.*`` with 403,
    binds in either direction included, through any server, and X stays usable."""
    source = uid("x-src")
    cluster = "amq.rookery.cluster"
    queue = uid("q-plain")
    internal_queue = "amq.rookery.q"
    with servers.connect(servers.a) as conn:
        ch = conn.channel()
        ch.exchange_declare(source, "fanout")
        ch.queue_declare(queue)
        ch.queue_bind(queue, source)
    attempts: dict[str, Any] = {
        "exchange.declare": lambda ch: ch.exchange_declare(cluster, "fanout"),
        "exchange.declare (another name)": lambda ch: ch.exchange_declare(
            "amq.rookery.mine", "fanout"
        ),
        "exchange.declare passive": lambda ch: ch.exchange_declare(cluster, passive=True),
        "exchange.delete": lambda ch: ch.exchange_delete(cluster),
        "exchange.bind into it": lambda ch: ch.exchange_bind(cluster, source, "k"),
        "exchange.bind out of it": lambda ch: ch.exchange_bind(source, cluster, "k"),
        "exchange.unbind into it": lambda ch: ch.exchange_unbind(cluster, source, "k"),
        "exchange.unbind out of it": lambda ch: ch.exchange_unbind(source, cluster, "k"),
        "queue.bind to it": lambda ch: ch.queue_bind(queue, cluster, "k"),
        "queue.unbind from it": lambda ch: ch.queue_unbind(queue, cluster, "k"),
        "queue.declare": lambda ch: ch.queue_declare(internal_queue),
        "queue.declare passive": lambda ch: ch.queue_declare(internal_queue, passive=True),
        "queue.bind": lambda ch: ch.queue_bind(internal_queue, source),
        "queue.purge": lambda ch: ch.queue_purge(internal_queue),
        "queue.delete": lambda ch: ch.queue_delete(internal_queue),
        "basic.get": lambda ch: ch.basic_get(internal_queue),
        "basic.consume": lambda ch: ch.basic_consume(internal_queue, lambda *a: None),
        "basic.publish": lambda ch: (ch.confirm_delivery(), ch.basic_publish(cluster, "k", b"x")),
    }
    answers = {}
    for index in (servers.a, servers.s):  # a primary and the secondary
        with servers.connect(index) as conn:
            for what, attempt in attempts.items():
                ch = conn.channel()
                try:
                    attempt(ch)
                    answers[(index, what)] = "accepted"
                except ChannelClosedByBroker as exc:
                    answers[(index, what)] = exc.reply_code
                    assert "internal to the broker" in exc.reply_text, (what, exc.reply_text)
    assert {k: v for k, v in answers.items() if v != 403} == {}
    for index in (servers.root, servers.a, servers.b, servers.s):
        with servers.connect(index) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish(source, "", b"still fine")  # raises if its channel is closed
    eventually(lambda: servers.depth(servers.a, queue) == (4, 0), 10, "4 in the queue")
