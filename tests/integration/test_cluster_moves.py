"""Operators move replicated queues between primaries, and rebalance them (issue 23).

Real brokerd processes on loopback (three primaries and a secondary), pika,
and ``brokerd ctl``. A move hands the queue over with nothing lost,
duplicated unflagged or reordered, under traffic through every server; what
cannot move is refused with the reason; a rebalance spreads the owners.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingConnection

from brokerd.server.control import request
from tests.conftest import uid
from tests.support.eventually import eventually
from tests.support.roles import Roles, settled

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

DURABLE = {"durable": True}


class Servers(Roles):
    def ctl(self, index: int, command: str, *args: str) -> dict[str, Any]:
        """The control socket's reply, refused or not (a move waits for its end)."""
        return request(self.cluster.nodes[index].data_dir, command, list(args), timeout=30)

    def declare(self, index: int, queue: str, **arguments: Any) -> None:
        with self.connect(index) as conn:
            conn.channel().queue_declare(queue, durable=True, arguments=arguments or None)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with settled(tmp_path_factory.mktemp("moves")) as roles:
        yield Servers(**vars(roles))


def publish(conn: BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)


def drain(conn: BlockingConnection, queue: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    ch = conn.channel()
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        got.append(body)
    return got


def test_a_deep_queue_moves_whole_and_in_order(servers: Servers) -> None:
    queue = uid("move-deep")
    servers.declare(servers.a, queue)
    assert servers.owner(queue) == servers.a
    bodies = [f"{i:06d}".encode() * (1 + i % 50) for i in range(2000)]
    with servers.connect(servers.s) as conn:
        publish(conn, queue, bodies)
    to = servers.cluster.spid(servers.b)
    reply = servers.ctl(servers.root, "queue", "move", queue, to)
    assert reply.get("ok"), reply
    moved = reply["result"]
    assert (moved["from"], moved["to"], moved["state"]) == (
        servers.cluster.spid(servers.a),
        to,
        "moved",
    )
    eventually(lambda: servers.owner(queue) == servers.b, 10, f"{queue} owned by b")
    with servers.connect(servers.a) as conn:
        got = drain(conn, queue, len(bodies))
    assert got == bodies  # byte for byte, in publish order, none twice


def test_a_move_under_traffic_loses_nothing_and_keeps_each_publishers_order(
    servers: Servers,
) -> None:
    queue = uid("move-live")
    servers.declare(servers.b, queue)
    received: list[tuple[str, int, bool]] = []
    confirmed: dict[str, int] = {}
    stop = threading.Event()
    published = threading.Event()  # every publisher is done
    errors: list[BaseException] = []

    def publisher(index: int) -> None:
        name = f"p{index}"
        try:
            with servers.connect(index) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                n = 0
                while not stop.is_set():
                    n += 1
                    ch.basic_publish(
                        "", queue, f"{name}:{n}".encode(), pika.BasicProperties(delivery_mode=2)
                    )
                    confirmed[name] = n
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    def consumer() -> None:
        try:
            with servers.connect(servers.root) as conn:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=20)

                def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
                    name, n = body.decode().split(":")
                    received.append((name, int(n), bool(method.redelivered)))
                    ch.basic_ack(method.delivery_tag)

                ch.basic_consume(queue, on_message)
                deadline = None
                while True:
                    conn.process_data_events(time_limit=0.1)
                    if published.is_set():
                        deadline = deadline or time.monotonic() + 20
                        if not behind() or time.monotonic() > deadline:
                            break
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    def behind() -> bool:
        """A confirmed message has not arrived yet."""
        got = {(name, n) for name, n, _r in received}
        return any(
            (name, n) not in got for name, top in confirmed.items() for n in range(1, top + 1)
        )

    publishers = [threading.Thread(target=publisher, args=(i,)) for i in (servers.a, servers.s)]
    threads = [*publishers, threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        first = servers.ctl(servers.s, "queue", "move", queue, servers.cluster.spid(servers.a))
        time.sleep(1.0)
        second = servers.ctl(servers.a, "queue", "move", queue, servers.cluster.spid(servers.root))
        time.sleep(1.0)
    finally:
        stop.set()
        deadline = time.monotonic() + 30
        for t in publishers:
            t.join(max(0.1, deadline - time.monotonic()))
        published.set()
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))
    assert not errors, errors
    assert first.get("ok") and second.get("ok"), (first, second)
    assert servers.owner(queue) == servers.root
    # every confirmed message arrived; a second copy only flagged redelivered; each
    # publisher's first deliveries in its order
    seen: dict[str, set[int]] = {}
    last: dict[str, int] = {}
    for name, n, redelivered in received:
        assert redelivered or n not in seen.get(name, set()), f"unflagged duplicate {name}:{n}"
        if not redelivered and n not in seen.get(name, set()):
            assert n > last.get(name, 0), f"{name}:{n} after {name}:{last.get(name)}"
            last[name] = n
        seen.setdefault(name, set()).add(n)
    for name, top in confirmed.items():
        missing = set(range(1, top + 1)) - seen.get(name, set())
        assert not missing, f"{name}: {len(missing)} confirmed messages lost, e.g. {min(missing)}"
        assert top > 50, f"{name} published only {top}: the move stalled it"


def test_moves_that_cannot_be_done_are_refused_with_the_reason(servers: Servers) -> None:
    classic = uid("move-classic")
    servers.declare(servers.a, classic, **{"x-queue-type": "classic"})
    reply = servers.ctl(servers.a, "queue", "move", classic, servers.cluster.spid(servers.b))
    assert not reply["ok"] and "classic queue" in reply["error"], reply
    replicated = uid("move-refused")
    servers.declare(servers.a, replicated)
    here = servers.ctl(servers.b, "queue", "move", replicated, servers.cluster.spid(servers.a))
    assert not here["ok"] and "already" in here["error"], here
    secondary = servers.ctl(servers.b, "queue", "move", replicated, servers.cluster.spid(3))
    assert not secondary["ok"] and "not a live primary" in secondary["error"], secondary
    missing = servers.ctl(servers.b, "queue", "move", uid("nope"), servers.cluster.spid(servers.a))
    assert not missing["ok"] and "no shared queue" in missing["error"], missing


def test_rebalance_spreads_the_owners_over_the_primaries(servers: Servers) -> None:
    names = [uid("rebalance") for _ in range(6)]
    for name in names:
        servers.declare(servers.root, name)
    # asked of the root: a rebalance is planned from the asking server's view of the
    # placements, and the root's has every declare it ordered
    reply = servers.ctl(servers.root, "queues", "rebalance")
    assert reply["ok"], reply
    moves = reply["result"]["moves"]
    assert moves and all(m["from"] == servers.cluster.spid(servers.root) for m in moves)

    def owned() -> list[int]:
        return [len(servers.cluster.ctl(i, "status")["owned_queues"]) for i in servers.primaries]

    eventually(
        lambda: max(owned()) - min(owned()) <= 1,
        15,
        "owners spread evenly",
        explain=lambda: f"owned per primary {owned()}; moves asked {moves}",
    )
    for name in names:  # every queue still answers, wherever it went
        with servers.connect(servers.a) as conn:
            conn.channel().queue_declare(name, passive=True)

    def owners(index: int) -> dict[str, str]:
        rows = servers.cluster.ctl(index, "queues")["queues"]
        return {r["name"]: r["owner"] for r in rows if r["shared"]}

    # balanced: asked again through the secondary, once it has every placement
    eventually(lambda: owners(servers.s) == owners(servers.root), 10, "the secondary's view")
    again = servers.ctl(servers.s, "queues", "rebalance")
    assert again["ok"] and again["result"]["moves"] == [], again
