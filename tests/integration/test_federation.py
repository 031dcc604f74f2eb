"""Federation between real standalone brokerds (issue 42), defined with ``brokerd ctl
federation`` in RabbitMQ's JSON: a federated exchange carries only what the
downstream's bindings want, a binding made later reaches the upstream, a loop of
two sites ends at ``max-hops`` instead of a storm, and a federated queue takes
from its upstream only while it has consumers and nothing for them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.brokerd_process import BrokerProcess
from tests.support.bridges import ctl_json, two_brokers
from tests.support.bridges import eventually as waited

pytestmark = pytest.mark.integration

POLICY_EXCHANGES = {
    "pattern": "^fed\\.",
    "definition": {"federation-upstream-set": "all"},
    "apply-to": "exchanges",
}


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with two_brokers(tmp_path, "up", "down") as both:
        yield both


ctl = ctl_json


def federate(
    down: BrokerProcess, up: BrokerProcess, password: str | None = None, **upstream: Any
) -> None:
    """``down``'s upstream ``up`` (``password``: guest's, a wrong one to be refused)."""
    login = f"guest:{password}@" if password else ""
    value = {"uri": f"amqp://{login}127.0.0.1:{up.port}", **upstream}
    ctl(down, "federation", "set", "federation-upstream", "up", json.dumps(value))


def links(proc: BrokerProcess) -> list[dict[str, Any]]:
    return list(ctl(proc, "federation", "status", "--json")["links"])


def eventually(check: Callable[[], bool], timeout: float, what: str, proc: BrokerProcess) -> None:
    waited(check, timeout, what, lambda: f"links {links(proc)}")


def channel(proc: BrokerProcess) -> Any:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proc.port)).channel()


def drain(proc: BrokerProcess, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    ch = channel(proc)
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((body, dict(props.headers or {})))
    ch.connection.close()
    return got


def test_a_federated_exchange_carries_what_the_downstreams_bindings_want(
    sites: tuple[BrokerProcess, BrokerProcess],
) -> None:
    up, down = sites
    up_ch, down_ch = channel(up), channel(down)
    for ch in (up_ch, down_ch):
        ch.exchange_declare("fed.orders", "topic", durable=True)
    down_ch.queue_declare("eu", durable=True)
    down_ch.queue_bind("eu", "fed.orders", "eu.#")
    # the guest password is refused: the link says so, with the upstream's reason
    federate(down, up, password="secret-pw")
    ctl(down, "federation", "set", "policy", "fed", json.dumps(POLICY_EXCHANGES))
    eventually(
        lambda: any(r["state"] == "terminated" and "403" in r["reason"] for r in links(down)),
        20,
        "the refused login",
        down,
    )
    assert "secret-pw" not in json.dumps(links(down)) + json.dumps(ctl(down, "federation", "list"))
    federate(down, up, **{"max-hops": 1, "expires": 60000})
    eventually(lambda: [r["state"] for r in links(down)] == ["running"], 20, "running", down)
    up_ch.confirm_delivery()
    for i in range(200):
        up_ch.basic_publish("fed.orders", "eu.new" if i % 2 else "us.new", f"o{i}".encode())
    eventually(lambda: len(_peek(down, "eu")) >= 100, 20, "the eu orders", down)
    time.sleep(0.5)  # anything more would show now
    got = drain(down, "eu")
    assert [b for b, _ in got] == [f"o{i}".encode() for i in range(1, 200, 2)]
    entry = got[0][1]["x-received-from"][0]
    assert entry["exchange"] == "fed.orders" and entry["redelivered"] is False
    assert entry["uri"] == f"amqp://127.0.0.1:{up.port}" and entry["cluster-name"]
    # a binding made later reaches the upstream, one removed stops its traffic
    down_ch.queue_declare("us", durable=True)
    down_ch.queue_bind("us", "fed.orders", "us.#")
    down_ch.queue_unbind("eu", "fed.orders", "eu.#")
    time.sleep(1.0)
    for i in range(10):
        up_ch.basic_publish("fed.orders", "eu.late" if i % 2 else "us.late", f"l{i}".encode())
    eventually(lambda: len(_peek(down, "us")) >= 5, 20, "the us orders", down)
    time.sleep(0.5)
    assert sorted(b for b, _ in drain(down, "us")) == sorted(
        f"l{i}".encode() for i in range(0, 10, 2)
    )
    assert drain(down, "eu") == []
    row = links(down)[0]
    assert (row["type"], row["kind"], row["object"], row["upstream"]) == (
        "federation",
        "exchange",
        "fed.orders",
        "up",
    )
    assert row["forwarded"] == row["acknowledged"] == 105


def _peek(proc: BrokerProcess, queue: str) -> list[int]:
    ch = channel(proc)
    try:
        return [0] * ch.queue_declare(queue, passive=True).method.message_count
    finally:
        ch.connection.close()


def test_a_loop_of_two_sites_ends_at_max_hops(
    sites: tuple[BrokerProcess, BrokerProcess],
) -> None:
    """Each site federates the other's exchange: a message goes round once at most
    (max-hops 1 and the downstream's own name), never a storm."""
    a, b = sites
    for one, other in ((a, b), (b, a)):
        ch = channel(one)
        ch.exchange_declare("fed.loop", "fanout", durable=True)
        ch.queue_declare("seen", durable=True)
        ch.queue_bind("seen", "fed.loop")
        ch.connection.close()
        ctl(
            one,
            "federation",
            "set",
            "federation-upstream",
            "other",
            json.dumps({"uri": f"amqp://127.0.0.1:{other.port}", "max-hops": 2}),
        )
        ctl(one, "federation", "set", "policy", "fed", json.dumps(POLICY_EXCHANGES))
    for one in (a, b):
        eventually(lambda: [r["state"] for r in links(one)] == ["running"], 20, "running", one)  # noqa: B023
    time.sleep(1.0)  # the bindings mirrored both ways
    ch = channel(a)
    ch.confirm_delivery()
    ch.basic_publish("fed.loop", "", b"once")
    time.sleep(2.0)
    on_a, on_b = drain(a, "seen"), drain(b, "seen")
    assert [body for body, _ in on_b] == [b"once"]
    assert [body for body, _ in on_a] == [b"once"], "back at its origin: the loop went on"


def test_a_federated_queue_takes_from_its_upstream_only_when_consumed(
    sites: tuple[BrokerProcess, BrokerProcess],
) -> None:
    up, down = sites
    up_ch = channel(up)
    up_ch.queue_declare("fed.jobs", durable=True)
    up_ch.confirm_delivery()
    for i in range(50):
        up_ch.basic_publish("", "fed.jobs", f"j{i}".encode())
    down_ch = channel(down)
    down_ch.queue_declare("fed.jobs", durable=True)
    federate(down, up, **{"prefetch-count": 10})
    policy = {**POLICY_EXCHANGES, "apply-to": "queues"}
    ctl(down, "federation", "set", "policy", "fed", json.dumps(policy))
    eventually(lambda: [r["state"] for r in links(down)] == ["running"], 20, "running", down)
    time.sleep(1.0)
    assert len(_peek(up, "fed.jobs")) == 50, "nothing moves while nobody consumes"
    got: list[bytes] = []
    down_ch.basic_qos(prefetch_count=5)
    down_ch.basic_consume(
        "fed.jobs", lambda ch, m, p, body: (got.append(body), ch.basic_ack(m.delivery_tag))
    )
    deadline = time.monotonic() + 20
    while len(got) < 50 and time.monotonic() < deadline:
        down_ch.connection.process_data_events(time_limit=0.2)
    assert sorted(got) == sorted(f"j{i}".encode() for i in range(50))
    assert len(_peek(up, "fed.jobs")) == 0
