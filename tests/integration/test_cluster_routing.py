"""Messages across the cluster: one shared queue mastered on the root, used from any server.

Real brokerd processes on loopback (three primaries and a secondary) and real
clients (pika, aio-pika, kombu, Celery). Each test names its servers by role:
``root`` masters every shared queue, ``a`` and ``b`` are the other primaries,
``s`` is the secondary. Tests that kill or stop servers build a cluster of
their own (``test_cluster_failover.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import aio_pika
import amqp
import kombu
import pika
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import ChannelClosedByBroker

from tests.conftest import uid
from tests.integration.test_errors import RawClient
from tests.support.eventually import eventually
from tests.support.roles import Roles, settled

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

ROOT_DIR = Path(__file__).resolve().parents[2]


class Routing(Roles):
    def all_depths(self, queue: str) -> set[tuple[int, int]]:
        return {self.depth(i, queue) for i in self.everyone}


@pytest.fixture(scope="module", params=["plain", "tls"])
def roles(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Routing]:
    """The cluster, with plain links and again with links over mutual TLS."""
    with settled(tmp_path_factory.mktemp("routing"), tls=request.param == "tls") as roles:
        yield Routing(**vars(roles))


def drain(conn: BlockingConnection, until: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def publish_confirmed(ch: BlockingChannel, queue: str, bodies: list[bytes], **kw: object) -> None:
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, **kw)  # raises if nacked or returned


# -- shared queues look the same from every server -------------------------------------------


def test_depth_consumers_and_purge_agree_on_every_server(roles: Routing) -> None:
    queue = uid("shared")
    with roles.connect(roles.a) as conn:
        ok = conn.channel().queue_declare(queue)
        assert (ok.method.message_count, ok.method.consumer_count) == (0, 0)
    with roles.connect(roles.b) as conn:
        publish_confirmed(conn.channel(), queue, [b"m%d" % i for i in range(200)])
    # a confirm from a non-root server means the root has the message
    assert roles.all_depths(queue) == {(200, 0)}
    with roles.connect(roles.s) as conn:
        ok = conn.channel().queue_declare(queue)  # a redeclare answers the root's counts too
        assert (ok.method.message_count, ok.method.consumer_count) == (200, 0)

    consumer_conn = roles.connect(roles.b)
    ch = consumer_conn.channel()
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(queue, lambda *args: None)
    assert roles.all_depths(queue) == {(199, 1)}  # one delivered and held, unacked
    with roles.connect(roles.a) as conn:
        assert conn.channel().queue_purge(queue).method.message_count == 199
    assert roles.all_depths(queue) == {(0, 1)}
    consumer_conn.close()  # the held message is requeued at the root
    assert eventually(lambda: roles.all_depths(queue) == {(1, 0)}, what="requeue on close")


def test_publish_on_one_server_consume_on_two_others(roles: Routing) -> None:
    queue = uid("spread")
    with roles.connect(roles.b) as conn:
        conn.channel().queue_declare(queue)
    received: dict[str, list[bytes]] = {"a": [], "s": []}
    stop = threading.Event()

    def consume(role: str, index: int) -> None:
        conn = roles.connect(index)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=20)

        def on(ch: BlockingChannel, method: object, props: object, body: bytes) -> None:
            received[role].append(body)
            ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        ch.basic_consume(queue, on)
        while not stop.is_set():
            conn.process_data_events(time_limit=0.05)
        conn.close()

    threads = [
        threading.Thread(target=consume, args=("a", roles.a)),
        threading.Thread(target=consume, args=("s", roles.s)),
    ]
    for t in threads:
        t.start()
    try:
        eventually(lambda: roles.depth(roles.root, queue)[1] == 2, what="both consumers attached")
        bodies = [b"%05d" % i for i in range(1000)]
        with roles.connect(roles.b) as conn:
            publish_confirmed(conn.channel(), queue, bodies)
        eventually(lambda: len(received["a"]) + len(received["s"]) >= 1000, 20, "all deliveries")
        time.sleep(0.3)  # a duplicate would arrive now
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    everything = received["a"] + received["s"]
    assert sorted(everything) == bodies  # each exactly once
    assert received["a"] and received["s"]  # round robin across servers
    for part in received.values():  # one publisher, one consumer: publish order
        assert part == sorted(part)


def test_get_through_other_servers(roles: Routing) -> None:
    queue = uid("get")
    with roles.connect(roles.root) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        publish_confirmed(ch, queue, [b"one", b"two", b"three"])
    with roles.connect(roles.s) as conn:
        ch = conn.channel()
        method, _props, body = ch.basic_get(queue)
        assert body == b"one" and method.message_count == 2 and not method.redelivered
        ch.basic_ack(method.delivery_tag)
    with roles.connect(roles.a) as conn:
        ch = conn.channel()
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"two"
    assert roles.all_depths(queue) == {(1, 0)}
    with roles.connect(roles.b) as conn:
        ch = conn.channel()
        assert ch.basic_get(queue, auto_ack=True)[2] == b"three"
        assert ch.basic_get(queue) == (None, None, None)  # get-empty


def test_nack_requeue_on_one_server_then_get_on_another(roles: Routing) -> None:
    queue = uid("requeue")
    with roles.connect(roles.a) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        publish_confirmed(ch, queue, [b"again"])
    with roles.connect(roles.b) as conn:
        ch = conn.channel()
        method, _props, body = ch.basic_get(queue)
        assert body == b"again" and not method.redelivered
        assert roles.depth(roles.a, queue) == (0, 0)  # acquired: nowhere to be had
        ch.basic_nack(method.delivery_tag, requeue=True)
        eventually(lambda: roles.depth(roles.root, queue)[0] == 1, what="requeued at the root")
    with roles.connect(roles.s) as conn:
        method, _props, body = conn.channel().basic_get(queue, auto_ack=True)
        assert body == b"again" and method.redelivered


def test_proxied_prefetch_holds_end_to_end(roles: Routing) -> None:
    queue = uid("prefetch")
    with roles.connect(roles.root) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        publish_confirmed(ch, queue, [b"%d" % i for i in range(50)])
    conn = roles.connect(roles.b)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=5)
        held: list[int] = []
        ch.basic_consume(queue, lambda ch, m, p, b: held.append(m.delivery_tag))
        drain(conn, lambda: len(held) >= 5)
        conn.process_data_events(time_limit=0.5)  # nothing more may come
        assert len(held) == 5
        assert roles.depth(roles.a, queue) == (45, 1)  # exactly five out, cluster-wide
        ch.basic_ack(held[-1], multiple=True)
        drain(conn, lambda: len(held) >= 10)
        conn.process_data_events(time_limit=0.3)
        assert len(held) == 10
        assert roles.depth(roles.s, queue) == (40, 1)
    finally:
        conn.close()
    assert eventually(lambda: roles.depth(roles.root, queue) == (45, 0), what="unacked requeued")


def test_closing_a_consumer_requeues_its_unacked_cluster_wide(roles: Routing) -> None:
    queue = uid("close")
    with roles.connect(roles.a) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        publish_confirmed(ch, queue, [b"%d" % i for i in range(10)])
    conn = roles.connect(roles.s)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume(queue, lambda ch, m, p, b: got.append(b))
    drain(conn, lambda: len(got) == 10)
    assert roles.depth(roles.b, queue) == (0, 1)
    conn.close()
    assert eventually(lambda: roles.all_depths(queue) == {(10, 0)}, what="requeued everywhere")
    with roles.connect(roles.b) as conn:
        ch = conn.channel()
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert method.redelivered and body == b"0"


# -- private queues and publishing ---------------------------------------------------------------


def test_a_private_queue_gets_publishes_made_on_other_servers(roles: Routing) -> None:
    key = uid("priv")
    owner = roles.connect(roles.a)
    try:
        ch = owner.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, "amq.topic", f"{key}.#")
        time.sleep(0.3)  # the meta-binding travels through the root to every server
        for index in (roles.b, roles.s, roles.root):
            with roles.connect(index) as conn:
                pub = conn.channel()
                pub.confirm_delivery()
                pub.basic_publish("amq.topic", f"{key}.from.{index}", b"%d" % index, mandatory=True)
        got: list[bytes] = []
        ch.basic_consume(queue, lambda c, m, p, b: got.append(b), auto_ack=True)
        drain(owner, lambda: len(got) == 3)
        assert sorted(got) == sorted(b"%d" % i for i in (roles.b, roles.s, roles.root))
        # by its name through the default exchange too (an RPC reply to a reply queue)
        for index in (roles.b, roles.s, roles.root):
            with roles.connect(index) as conn:
                pub = conn.channel()
                pub.confirm_delivery()
                pub.basic_publish("", queue, b"reply-%d" % index, mandatory=True)
        drain(owner, lambda: len(got) == 6)
        assert sorted(got[3:]) == sorted(b"reply-%d" % i for i in (roles.b, roles.s, roles.root))
        # the queue is exclusive: another connection, on any server, is refused it (405)
        with roles.connect(roles.b) as conn, pytest.raises(ChannelClosedByBroker) as info:
            conn.channel().queue_declare(queue, passive=True)
        assert info.value.reply_code == 405
    finally:
        owner.close()
    # the owner left: the meta-binding went with the queue, so a mandatory publish returns
    time.sleep(0.3)
    with roles.connect(roles.s) as conn:
        pub = conn.channel()
        pub.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            pub.basic_publish("amq.topic", f"{key}.late", b"x", mandatory=True)
        with pytest.raises(pika.exceptions.UnroutableError):
            pub.basic_publish("", queue, b"x", mandatory=True)


def test_mandatory_publish_nobody_takes_is_returned_to_its_publisher(roles: Routing) -> None:
    with roles.connect(roles.b) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", uid("nowhere"), b"x", mandatory=True)


def test_no_local_holds_across_the_cluster(roles: Routing) -> None:
    """A no-local consumer on one server does not get what its own connection
    published, although the queue and its round robin live on the root."""
    queue = uid("nolocal")
    conn = amqp.Connection(f"127.0.0.1:{roles.port(roles.b)}")  # py-amqp speaks no_local
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        got: list[bytes] = []
        ch.basic_consume(queue, no_local=True, no_ack=True, callback=lambda m: got.append(m.body))
        with roles.connect(roles.a) as other:
            publish_confirmed(other.channel(), queue, [b"theirs"])
        ch.basic_publish(amqp.Message(b"mine"), routing_key=queue)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(socket.timeout):
                conn.drain_events(timeout=0.1)
        with contextlib.suppress(socket.timeout):
            conn.drain_events(timeout=0.3)
        assert got == [b"theirs"]
        assert roles.depth(roles.s, queue)[0] == 1  # "mine" waits for another consumer
    finally:
        conn.close()


def test_exclusive_consumer_spans_the_cluster(roles: Routing) -> None:
    queue = uid("excl")
    first = roles.connect(roles.a)
    try:
        ch = first.channel()
        ch.queue_declare(queue)
        ch.basic_consume(queue, lambda *a: None, exclusive=True)
        with roles.connect(roles.b) as conn, pytest.raises(ChannelClosedByBroker) as info:
            conn.channel().basic_consume(queue, lambda *a: None)
        assert info.value.reply_code == 403
    finally:
        first.close()


def test_deleting_a_queue_cancels_its_consumers_on_every_server(roles: Routing) -> None:
    queue = uid("doomed")
    conns = {role: roles.connect(getattr(roles, role)) for role in ("a", "b", "s")}
    cancelled: dict[str, bool] = {}
    try:
        conns["a"].channel().queue_declare(queue)
        for role, conn in conns.items():
            ch = conn.channel()
            ch.add_on_cancel_callback(lambda frame, role=role: cancelled.__setitem__(role, True))
            ch.basic_consume(queue, lambda *a: None)
        assert roles.depth(roles.root, queue) == (0, 3)
        with roles.connect(roles.root) as conn:
            conn.channel().queue_delete(queue)
        for role, conn in conns.items():
            drain(conn, lambda role=role: role in cancelled, timeout=5)
        assert cancelled == {"a": True, "b": True, "s": True}
    finally:
        for conn in conns.values():
            conn.close()


def test_auto_delete_waits_for_the_last_consumer_anywhere(roles: Routing) -> None:
    queue = uid("auto")
    one, two = roles.connect(roles.a), roles.connect(roles.s)
    try:
        one.channel().queue_declare(queue, auto_delete=True)
        ch1, ch2 = one.channel(), two.channel()
        tag1 = ch1.basic_consume(queue, lambda *a: None)
        ch2.basic_consume(queue, lambda *a: None)
        ch1.basic_cancel(tag1)
        time.sleep(0.3)
        assert roles.depth(roles.b, queue) == (0, 1)  # another server still consumes
    finally:
        one.close()
        two.close()
    assert eventually(lambda: not roles.exists(roles.b, queue), what="auto-deleted queue")


def test_wiring_errors_come_from_the_root_with_their_codes(roles: Routing) -> None:
    queue = uid("eq")
    with roles.connect(roles.a) as conn:
        conn.channel().queue_declare(queue, durable=True)
    with roles.connect(roles.b) as conn, pytest.raises(ChannelClosedByBroker) as info:
        conn.channel().queue_declare(queue, durable=False)
    assert info.value.reply_code == 406
    with roles.connect(roles.s) as conn:
        ch = conn.channel()
        name = ch.queue_declare("", exclusive=False).method.queue  # server-named, shared
        assert name.startswith("amq.gen-")
    assert roles.depth(roles.root, name) == (0, 0)


def test_open_ok_lists_the_known_hosts(roles: Routing) -> None:
    with RawClient(roles.port(roles.s)) as raw:
        raw.send(b"AMQP\x00\x00\x09\x01")
        raw.expect(commands.Connection.Start)
        raw.send_frames(
            (0, commands.Connection.StartOk({}, "PLAIN", "\0guest\0guest", "en_US")),
        )
        raw.expect(commands.Connection.Tune)
        raw.send_frames(
            (0, commands.Connection.TuneOk(2047, 131072, 0)), (0, commands.Connection.Open("/"))
        )
        ok = raw.expect(commands.Connection.OpenOk)
    hosts = set(ok.known_hosts.split(","))
    # the cluster file's addresses: the AMQPS ports when links run over TLS
    known = [n.tls_port or n.port for n in roles.cluster.nodes if n.kind == "primary"]
    assert {f"127.0.0.1:{p}" for p in known} <= hosts


# -- other clients ---------------------------------------------------------------------------------


def test_aio_pika_publish_on_one_server_consume_on_the_secondary(roles: Routing) -> None:
    async def run() -> list[bytes]:
        queue_name = uid("aio")
        publisher = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{roles.port(roles.a)}/")
        consumer = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{roles.port(roles.s)}/")
        async with publisher, consumer:
            pch = await publisher.channel()
            await pch.declare_queue(queue_name)
            cch = await consumer.channel()
            await cch.set_qos(prefetch_count=3)
            queue = await cch.declare_queue(queue_name, passive=True)
            got: list[bytes] = []
            done = asyncio.Event()

            async def on(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    got.append(message.body)
                    if len(got) == 30:
                        done.set()

            await queue.consume(on)
            for i in range(30):
                await pch.default_exchange.publish(aio_pika.Message(b"%02d" % i), queue_name)
            await asyncio.wait_for(done.wait(), 15)
            return got

    got = asyncio.run(run())
    assert got == [b"%02d" % i for i in range(30)]


def test_kombu_simple_queue_across_servers(roles: Routing) -> None:
    name = uid("kombu")
    publisher = kombu.Connection(f"amqp://guest:guest@127.0.0.1:{roles.port(roles.b)}//")
    with publisher, publisher.SimpleQueue(name) as q:
        for i in range(5):
            q.put({"n": i})
    consumer = kombu.Connection(f"amqp://guest:guest@127.0.0.1:{roles.port(roles.s)}//")
    got = []
    with consumer, consumer.SimpleQueue(name) as q:
        for _ in range(5):
            message = q.get(timeout=10)
            got.append(message.payload["n"])
            message.ack()
    assert got == [0, 1, 2, 3, 4]


CELERY_CLIENT = """
import sys
from tests.integration import celery_app
app = celery_app.app
app.conf.update(broker_url=sys.argv[1], task_default_queue=sys.argv[2])
results = [celery_app.add.delay(i, i) for i in range(10)]
values = [r.get(timeout=30) for r in results]
assert values == [2 * i for i in range(10)], values
try:
    celery_app.fail.delay("boom").get(timeout=30)
except ValueError as exc:
    assert "boom" in str(exc)
else:
    raise AssertionError("the failure did not propagate")
print("OK", values)
"""


def test_celery_worker_on_one_server_client_on_another(roles: Routing, tmp_path: Path) -> None:
    from tests.integration.test_celery_worker import Worker

    queue = f"rookery-cluster-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        f"amqp://guest:guest@127.0.0.1:{roles.port(roles.a)}//", queue, tmp_path / "worker.log"
    )
    try:
        worker.wait_ready()
        client = subprocess.run(
            [
                sys.executable,
                "-c",
                CELERY_CLIENT,
                f"amqp://guest:guest@127.0.0.1:{roles.port(roles.b)}//",
                queue,
            ],
            cwd=ROOT_DIR,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert client.returncode == 0, client.stdout + client.stderr + worker.log_text()[-3000:]
        assert "OK" in client.stdout
    finally:
        worker.stop()


# -- TTL and dead-lettering hold on the root's shared queues -----------------------------------


def dead_letter_target(ch: BlockingChannel, name: str) -> tuple[str, str]:
    """A direct exchange and a shared queue bound to it with the queue's own name."""
    exchange, queue = f"{name}-dlx", f"{name}-dead"
    ch.exchange_declare(exchange, "direct")
    ch.queue_declare(queue)
    ch.queue_bind(queue, exchange, queue)
    return exchange, queue


def get_on(roles: Routing, index: int, queue: str, timeout: float = 10.0) -> tuple:
    """basic.get with auto-ack on ``index``, waiting until the queue has a message there."""
    with roles.connect(index) as conn:
        ch = conn.channel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                return method, props, body
            time.sleep(0.05)
    raise AssertionError(f"nothing in {queue} on server {index} within {timeout}s")


def test_expired_messages_of_a_shared_queue_are_dead_lettered_once(roles: Routing) -> None:
    """x-message-ttl and expiration run on the root; each expiry dead-letters once, in order."""
    name = uid("ttl")
    with roles.connect(roles.a) as conn:
        ch = conn.channel()
        exchange, dead = dead_letter_target(ch, name)
        ch.queue_declare(
            name,
            arguments={
                "x-message-ttl": 300,
                "x-dead-letter-exchange": exchange,
                "x-dead-letter-routing-key": dead,
            },
        )
    with roles.connect(roles.b) as conn:  # published through a server that is not root
        ch = conn.channel()
        publish_confirmed(ch, name, [b"t%d" % i for i in range(5)])
        ch.basic_publish("", name, b"short", pika.BasicProperties(expiration="50"))
    eventually(lambda: roles.all_depths(dead) == {(6, 0)}, what="six dead letters everywhere")
    assert roles.all_depths(name) == {(0, 0)}
    got = [get_on(roles, roles.s, dead) for _ in range(6)]
    assert [body for _m, _p, body in got] == [b"t%d" % i for i in range(5)] + [b"short"]
    for method, props, _body in got:
        assert method.exchange == exchange and method.routing_key == dead
        (death,) = props.headers["x-death"]
        assert (death["count"], death["reason"], death["queue"]) == (1, "expired", name)
        assert death["exchange"] == "" and death["routing-keys"] == [name]
    assert got[-1][1].headers["x-death"][0]["original-expiration"] == "50"
    assert roles.all_depths(dead) == {(0, 0)}


def test_a_reject_through_a_proxy_dead_letters_on_the_root(roles: Routing) -> None:
    name = uid("rej")
    with roles.connect(roles.root) as conn:
        ch = conn.channel()
        exchange, dead = dead_letter_target(ch, name)
        ch.queue_declare(name, arguments={"x-dead-letter-exchange": exchange})
        ch.queue_unbind(dead, exchange, dead)
        ch.queue_bind(dead, exchange, name)  # no dead-letter key: the original key is kept
        publish_confirmed(ch, name, [b"no", b"yes"])
    with roles.connect(roles.s) as conn:
        ch = conn.channel()
        first, _p, body = ch.basic_get(name)
        assert body == b"no"
        ch.basic_reject(first.delivery_tag, requeue=False)
        second, _p, body = ch.basic_get(name)
        assert body == b"yes"
        ch.basic_nack(second.delivery_tag, requeue=True)  # requeued, not dead-lettered
    method, props, body = get_on(roles, roles.b, dead)
    assert body == b"no" and method.routing_key == name
    (death,) = props.headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", name, 1)
    assert props.headers["x-first-death-reason"] == "rejected"
    assert roles.all_depths(name) == {(1, 0)} and roles.all_depths(dead) == {(0, 0)}


def test_x_expires_deletes_an_unused_shared_queue_cluster_wide(roles: Routing) -> None:
    used, unused = uid("exp-used"), uid("exp-unused")
    with roles.connect(roles.a) as conn:
        ch = conn.channel()
        ch.queue_declare(unused, arguments={"x-expires": 600})
        ch.queue_declare(used, arguments={"x-expires": 600})

    def gone_after_a_quiet_spell(queue: str, tries: int = 6) -> bool:
        """A passive declare is a use (it renews the lease, as in RabbitMQ): look only
        after a spell longer than x-expires with nothing touching the queue."""
        for _ in range(tries):
            time.sleep(1.5)
            if not any(roles.exists(i, queue) for i in (roles.root, roles.a, roles.b, roles.s)):
                return True
        return False

    holder = roles.connect(roles.s)  # a consumer on another server keeps ``used`` in use
    try:
        holder.channel().basic_consume(used, lambda *a: None)
        assert gone_after_a_quiet_spell(unused), "the unused queue deleted everywhere"
        assert roles.all_depths(used) == {(0, 1)}
    finally:
        holder.close()
    assert gone_after_a_quiet_spell(used), "deleted once its consumer went"


def test_a_client_cannot_publish_to_the_cluster_exchange(roles: Routing) -> None:
    """Links' records are taken before routing; anyone else publishing to the cluster
    exchange is refused, and the cluster goes on."""
    conn = roles.connect(roles.a)
    try:
        channel = conn.channel()
        channel.basic_publish("amq.rookery.cluster", "cluster.status", b'{"v": 1}')
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare("", exclusive=True)  # the refusal arrives first
        assert refused.value.reply_code == 403
        assert "internal to the broker" in refused.value.reply_text
        other = conn.channel()
        name = uid("after-refusal")
        other.queue_declare(name, durable=True)
        other.basic_publish("", name, b"still routed")
        eventually(lambda: roles.depth(roles.b, name)[0] == 1, what="the publish after it")
    finally:
        conn.close()


def test_a_bind_ok_waits_until_every_server_has_the_binding(roles: Routing) -> None:
    """The bind-ok comes once every server has applied the binding, as RabbitMQ's
    does: a publish right after it through any other server is routed. With
    clients whose connections land on any server (brokerd --workers) the next
    connection is as likely to be elsewhere as not. Shown with a server that is
    paused (shorter than the heartbeat timeout): the bind waits for it."""
    key = uid("waits")
    binder, late = roles.a, roles.b
    conn = roles.connect(binder)
    publisher = roles.connect(late)
    try:
        ch = conn.channel()
        queue = ch.queue_declare(key).method.queue
        roles.cluster.pause(late)
        try:
            started = time.monotonic()
            threading.Timer(1.0, roles.cluster.resume, args=(late,)).start()
            ch.queue_bind(queue, "amq.direct", key)
            took = time.monotonic() - started
        finally:
            time.sleep(max(0.0, 1.2 - (time.monotonic() - started)))
        assert took >= 0.9, f"the bind-ok came {took:.2f} s after the bind, before {late} had it"
        pub = publisher.channel()
        pub.confirm_delivery()
        pub.basic_publish("amq.direct", key, b"routed", mandatory=True)
        _method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"routed"
        ch.queue_delete(queue)
    finally:
        conn.close()
        publisher.close()
