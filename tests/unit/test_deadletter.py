"""Dead-lettering: RabbitMQ 3.10's x-death header, cycles, and the three reasons."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.model.deadletter import dead_letter_copy, is_cycle
from brokerd.model.message import Message
from brokerd.model.queue import Queue
from brokerd.model.vhost import VirtualHost
from brokerd.store.disk import DiskStore
from brokerd.wire import codec
from brokerd.wire import tables as t
from tests.unit.queue_support import FakeTimers, Sink, bodies, declare, msg

NOW = 1_700_000_000
WHEN = datetime.datetime.fromtimestamp(NOW, tz=datetime.UTC)


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTimers]:
    fake = FakeTimers()
    monkeypatch.setattr(Queue, "timers", fake)
    yield fake


def headers(message: Message) -> dict[str, Any]:
    return codec.decode_properties(message.props_raw).headers or {}


def raw_headers(message: Message) -> list[t.Entry]:
    return t.parse_table(t.split_properties(message.props_raw)[t.HEADERS])


def deaths(message: Message) -> list[dict[str, Any]]:
    return headers(message)["x-death"]


def test_the_first_death() -> None:
    source = msg("body", exchange="ex", routing_key="rk", expiration="5000", headers={"a": "b"})
    copy, _ = dead_letter_copy(source, "expired", "q1", "dlx", None, NOW)
    assert (copy.exchange, copy.routing_key, copy.body) == ("dlx", "rk", b"body")
    props = codec.decode_properties(copy.props_raw)
    assert props.expiration is None  # removed, noted as original-expiration
    assert props.headers == {
        "a": "b",
        "x-death": [
            {
                "count": 1,
                "reason": "expired",
                "queue": "q1",
                "time": WHEN,
                "exchange": "ex",
                "routing-keys": ["rk"],
                "original-expiration": "5000",
            }
        ],
        "x-first-death-exchange": "ex",
        "x-first-death-queue": "q1",
        "x-first-death-reason": "expired",
    }


def test_the_field_types_and_order_are_rabbitmqs() -> None:
    copy, _ = dead_letter_copy(msg("b", exchange="ex"), "rejected", "q1", "dlx", None, NOW)
    entries = raw_headers(copy)
    # the table is sorted by key, as RabbitMQ's set_table_value leaves it
    assert [k for k, _ in entries] == [
        b"x-death",
        b"x-first-death-exchange",
        b"x-first-death-queue",
        b"x-first-death-reason",
    ]
    (death,) = t.parse_array(entries[0][1])
    fields = t.parse_table(death, 1)
    # the first entry keeps rabbit_dead_letter's order, unsorted
    assert [k for k, _ in fields] == [
        b"count",
        b"reason",
        b"queue",
        b"time",
        b"exchange",
        b"routing-keys",
    ]
    types = {k: v[:1] for k, v in fields}
    assert types == {
        b"count": b"l",  # a long (64 bits), as Java clients cast it
        b"reason": b"S",
        b"queue": b"S",
        b"time": b"T",
        b"exchange": b"S",
        b"routing-keys": b"A",
    }


def test_client_header_types_survive() -> None:
    # a long-long 1 and a 32-bit float that pamqp would re-encode as b and d
    table = t.encode_table([(b"n", b"l" + (1).to_bytes(8, "big")), (b"f", b"f\x3f\x80\x00\x00")])
    raw = t.join_properties({t.HEADERS: table})
    source = Message("ex", "rk", raw, b"x")
    copy, _ = dead_letter_copy(source, "rejected", "q", "dlx", None, NOW)
    kept = dict(raw_headers(copy))
    assert kept[b"n"] == b"l" + (1).to_bytes(8, "big")
    assert kept[b"f"] == b"f\x3f\x80\x00\x00"


def test_a_second_death_in_the_same_queue_for_the_same_reason_counts() -> None:
    first, _ = dead_letter_copy(msg("b", exchange="ex"), "expired", "q1", "dlx", None, NOW)
    second, _ = dead_letter_copy(first, "rejected", "q2", "dlx2", None, NOW + 5)
    third, _ = dead_letter_copy(second, "expired", "q1", "dlx", None, NOW + 10)
    found = deaths(third)
    assert [(d["queue"], d["reason"], d["count"]) for d in found] == [
        ("q1", "expired", 2),
        ("q2", "rejected", 1),
    ]
    # only the count changes: time and exchange are the first death's; keys are sorted
    assert found[0]["time"] == WHEN and found[0]["exchange"] == "ex"
    (death, _) = t.parse_array(dict(raw_headers(third))[b"x-death"])
    assert [k for k, _ in t.parse_table(death, 1)] == sorted(
        [b"count", b"reason", b"queue", b"time", b"exchange", b"routing-keys"]
    )
    # the first-death headers never change
    assert headers(third)["x-first-death-queue"] == "q1"
    assert headers(third)["x-first-death-exchange"] == "ex"


def test_three_queues_come_out_in_rabbitmq_3_10s_order() -> None:
    """A list of two or more is grouped first, which in 3.10 reverses it."""
    m, _ = dead_letter_copy(msg("b"), "expired", "q1", "x", None, NOW)
    m, _ = dead_letter_copy(m, "expired", "q2", "x", None, NOW)
    assert [d["queue"] for d in deaths(m)] == ["q2", "q1"]
    m, _ = dead_letter_copy(m, "expired", "q3", "x", None, NOW)
    assert [d["queue"] for d in deaths(m)] == ["q3", "q1", "q2"]


def test_legacy_duplicates_are_grouped_with_their_count() -> None:
    entry = t.table([(b"reason", t.longstr(b"expired")), (b"queue", t.longstr(b"q1"))])
    other = t.table([(b"reason", t.longstr(b"maxlen")), (b"queue", t.longstr(b"q9"))])
    table = t.encode_table([(b"x-death", t.array([entry, entry, other]))])
    source = Message("ex", "rk", t.join_properties({t.HEADERS: table}), b"x")
    copy, _ = dead_letter_copy(source, "rejected", "q5", "dlx", None, NOW)
    found = deaths(copy)
    assert [(d["queue"], d.get("count")) for d in found] == [("q5", 1), ("q9", 1), ("q1", 2)]


def test_a_dead_letter_routing_key_replaces_the_key_and_drops_cc() -> None:
    source = msg("b", exchange="ex", routing_key="rk", headers={"CC": ["other"], "z": 1})
    copy, _ = dead_letter_copy(source, "rejected", "q", "dlx", "dead", NOW)
    assert copy.routing_key == "dead"
    found = headers(copy)
    assert "CC" not in found and found["z"] == 1
    assert found["x-death"][0]["routing-keys"] == ["rk", "other"]


def test_without_a_dead_letter_routing_key_cc_stays() -> None:
    source = msg("b", exchange="ex", routing_key="rk", headers={"CC": ["other"]})
    copy, _ = dead_letter_copy(source, "rejected", "q", "dlx", None, NOW)
    assert copy.routing_key == "rk" and headers(copy)["CC"] == ["other"]


def test_an_x_death_that_is_not_an_array_is_reset() -> None:
    source = msg("b", headers={"x-death": "garbage"})
    copy, _ = dead_letter_copy(source, "rejected", "q", "dlx", None, NOW)
    assert [d["queue"] for d in deaths(copy)] == ["q"]
    assert "x-first-death-queue" not in headers(copy)  # only set when x-death was absent


def test_cycles() -> None:
    m, found = dead_letter_copy(msg("b"), "expired", "a", "x", None, NOW)
    assert is_cycle("a", found)  # straight back to itself, automatically
    assert not is_cycle("b", found)
    m, found = dead_letter_copy(m, "maxlen", "b", "x", None, NOW)
    assert is_cycle("a", found) and is_cycle("b", found)
    m, found = dead_letter_copy(m, "rejected", "c", "x", None, NOW)
    assert not is_cycle("a", found)  # a client's rejection is in the cycle
    assert not is_cycle("c", found)


# -- through queues and the vhost -------------------------------------------------------


@pytest.fixture
def vhost() -> VirtualHost:
    vhost = VirtualHost("/")
    vhost.declare_exchange("dlx", "fanout")
    dead = declare(vhost, "dead")
    vhost.bind(vhost.exchange("dlx"), dead, "")
    return vhost


def test_rejected_messages_are_dead_lettered(vhost: VirtualHost) -> None:
    queue = declare(vhost, "q", **{"x-dead-letter-exchange": "dlx"})
    queue.push(msg("a"))
    queue.push(msg("b"))
    consumer = Sink()
    queue.add_consumer(consumer)
    queue.reject(consumer.take(b"b"))
    queue.requeue(consumer.take(b"a"))  # requeue=true: not a death
    dead = vhost.queues["dead"]
    assert bodies(dead) == [b"b"]
    (death,) = deaths(dead.ready()[0][0])
    assert (death["reason"], death["queue"], death["exchange"]) == ("rejected", "q", "")
    assert queue.stats_dead_lettered == 1


def test_expired_messages_are_dead_lettered_to_a_routing_key(
    vhost: VirtualHost, timers: FakeTimers
) -> None:
    declare(vhost, "retry")
    args = {
        "x-message-ttl": 100,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "retry",
    }
    queue = declare(vhost, "q", **args)
    queue.push(msg("a", expiration="50"))
    queue.push(msg("b"))
    timers.advance(0.2)
    retry = vhost.queues["retry"]
    assert bodies(retry) == [b"a", b"b"]
    first = retry.ready()[0][0]
    assert first.routing_key == "retry"
    assert codec.decode_properties(first.props_raw).expiration is None
    assert deaths(first)[0]["original-expiration"] == "50"
    assert "original-expiration" not in deaths(retry.ready()[1][0])[0]


def test_drop_head_overflow_dead_letters_maxlen(vhost: VirtualHost) -> None:
    queue = declare(vhost, "q", **{"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    for body in ("1", "2", "3", "4"):
        queue.push(msg(body))
    assert bodies(queue) == [b"3", b"4"]
    dead = vhost.queues["dead"]
    assert bodies(dead) == [b"1", b"2"]
    assert {d["reason"] for m, _ in dead.ready() for d in deaths(m)} == {"maxlen"}


def test_reject_publish_dlx_dead_letters_the_refused_publish(vhost: VirtualHost) -> None:
    args = {"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": "dlx"}
    queue = declare(vhost, "q", **args)
    assert queue.push(msg("1"))
    assert not queue.push(msg("2"))
    assert bodies(queue) == [b"1"] and bodies(vhost.queues["dead"]) == [b"2"]


def test_plain_reject_publish_does_not_dead_letter(vhost: VirtualHost) -> None:
    args = {"x-max-length": 1, "x-overflow": "reject-publish", "x-dead-letter-exchange": "dlx"}
    queue = declare(vhost, "q", **args)
    queue.push(msg("1"))
    assert not queue.push(msg("2"))
    assert bodies(vhost.queues["dead"]) == []


def test_a_missing_dead_letter_exchange_drops_silently(vhost: VirtualHost) -> None:
    queue = declare(vhost, "q", **{"x-dead-letter-exchange": "nowhere"})
    queue.push(msg("a"))
    got = queue.take()
    assert got is not None
    queue.reject([got[0]])
    assert queue.message_count == 0 and queue.stats_dead_lettered == 0


def test_expiring_into_itself_is_a_cycle_and_dropped(
    vhost: VirtualHost, timers: FakeTimers
) -> None:
    args = {"x-message-ttl": 10, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q"}
    queue = declare(vhost, "q", **args)
    queue.push(msg("a"))
    timers.advance(0.05)
    assert queue.message_count == 0 and timers.pending == []


def test_two_queues_expiring_into_each_other_stop_after_one_round(
    vhost: VirtualHost, timers: FakeTimers
) -> None:
    a = declare(vhost, "a", **{"x-message-ttl": 10, "x-dead-letter-exchange": "to-b"})
    b = declare(vhost, "b", **{"x-message-ttl": 10, "x-dead-letter-exchange": "to-a"})
    for name, target in (("to-a", a), ("to-b", b)):
        vhost.declare_exchange(name, "fanout")
        vhost.bind(vhost.exchange(name), target, "")
    a.push(msg("m"))
    timers.advance(0.015)
    assert bodies(b) == [b"m"]
    timers.advance(0.015)  # back to a would close an automatic cycle: dropped
    assert a.message_count == 0 and b.message_count == 0


def test_a_rejection_in_the_cycle_lets_it_through(vhost: VirtualHost, timers: FakeTimers) -> None:
    a = declare(vhost, "a", **{"x-message-ttl": 10, "x-dead-letter-exchange": "to-b"})
    b = declare(vhost, "b", **{"x-dead-letter-exchange": "to-a"})
    for name, target in (("to-a", a), ("to-b", b)):
        vhost.declare_exchange(name, "fanout")
        vhost.bind(vhost.exchange(name), target, "")
    a.push(msg("m"))
    timers.advance(0.015)
    got = b.take()
    assert got is not None
    b.reject([got[0]])  # rejected in b: back to a is allowed
    assert bodies(a) == [b"m"]
    back = a.ready()[0][0]
    assert [(d["queue"], d["reason"]) for d in deaths(back)] == [
        ("b", "rejected"),
        ("a", "expired"),
    ]
    timers.advance(0.015)  # expires in a again: counted there, goes on to b
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths(b.ready()[0][0])] == [
        ("a", "expired", 2),
        ("b", "rejected", 1),
    ]


def test_max_length_bytes_drops_heads_until_the_bodies_fit(vhost: VirtualHost) -> None:
    args = {"x-max-length-bytes": 10, "x-dead-letter-exchange": "dlx"}
    queue = declare(vhost, "q", **args)
    for body in ("aaaa", "bbbb", "cccc"):  # 12 bytes: "aaaa" goes
        queue.push(msg(body))
    assert bodies(queue) == [b"bbbb", b"cccc"]
    queue.push(msg("0123456789"))  # exactly the limit alone: all the others go
    assert bodies(queue) == [b"0123456789"]
    queue.push(msg("0123456789A"))  # larger than the limit: dropped as soon as enqueued
    assert bodies(queue) == []
    dead = vhost.queues["dead"]
    assert bodies(dead) == [b"aaaa", b"bbbb", b"cccc", b"0123456789", b"0123456789A"]
    assert {d["reason"] for m, _ in dead.ready() for d in deaths(m)} == {"maxlen"}


def test_max_length_bytes_counts_requeued_messages(vhost: VirtualHost) -> None:
    queue = declare(vhost, "q", **{"x-max-length-bytes": 8, "x-overflow": "reject-publish"})
    assert queue.push(msg("aaaa"))
    got = queue.take()
    assert got is not None
    assert queue.push(msg("bbbb"))
    queue.requeue([got[0]])
    assert not queue.push(msg("c"))  # 8 bytes ready again
    assert bodies(queue) == [b"aaaa", b"bbbb"]


def test_paged_messages_count_and_keep_their_bodies(tmp_path: Path, timers: FakeTimers) -> None:
    """Flow to disk: bodies paged out still count against x-max-length-bytes, and
    what is dropped or expired goes to the DLX with its body read back."""
    store = DiskStore(tmp_path, page_limit=10)
    vhost = VirtualHost("/", store)
    dead = declare(vhost, "dead")
    args = {
        "x-max-length-bytes": 40,
        "x-message-ttl": 1000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dead",
    }
    queue = declare(vhost, "q", **args)
    for i in range(8):
        queue.push(msg(f"body-{i:03d}"))  # 8 bytes each; from the third on paged out
    assert any(m.paged for m in queue.messages)
    assert queue.message_count == 5 and queue.bytes + queue._paged_bytes == 40
    timers.advance(1.1)
    assert queue.message_count == 0 and queue.bytes + queue._paged_bytes == 0
    got = [dead.take(no_ack=True) for _ in range(8)]
    assert [bytes(g[0].body) for g in got if g] == [b"body-%03d" % i for i in range(8)]
    assert [d["reason"] for g in got if g for d in deaths(g[0])] == ["maxlen"] * 3 + ["expired"] * 5
