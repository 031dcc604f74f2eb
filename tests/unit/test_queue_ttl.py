"""Message TTL and x-expires in the queue model, on a clock moved by hand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from brokerd.model.errors import ChannelError
from brokerd.model.expiry import check_expiration, parse_expiration
from brokerd.model.queue import Queue
from brokerd.model.vhost import VirtualHost
from brokerd.wire import codec
from tests.unit.queue_support import FakeTimers, Sink, bodies, declare, msg


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTimers]:
    fake = FakeTimers()
    monkeypatch.setattr(Queue, "timers", fake)
    yield fake


@pytest.fixture
def vhost() -> VirtualHost:
    return VirtualHost("/")


def test_queue_ttl_expires_messages_with_one_timer(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q", **{"x-message-ttl": 1000})
    for i in range(100):
        queue.push(msg(str(i)))
        timers.advance(0.001)
    assert len(timers.pending) == 1  # one timer, for the head: not one per message
    timers.advance(0.95)
    assert queue.message_count == 50  # those enqueued in the first 50 ms are gone
    assert queue.stats_expired == 50
    timers.advance(0.1)
    assert queue.message_count == 0 and queue.stats_expired == 100
    assert timers.pending == [] and queue._deadlines == {}


def test_an_expired_message_is_never_got_even_before_the_timer_runs(
    vhost: VirtualHost, timers: FakeTimers
) -> None:
    queue = declare(vhost, "q", **{"x-message-ttl": 100})
    queue.push(msg("old"))
    timers.t += 0.05
    queue.push(msg("young"))
    timers.t += 0.06  # past the first one's deadline; no timer has run
    got = queue.take()
    assert got is not None and got[0].body == b"young" and got[2] == 0
    assert queue.stats_expired == 1


def test_an_expired_message_is_never_delivered_to_a_consumer(
    vhost: VirtualHost, timers: FakeTimers
) -> None:
    queue = declare(vhost, "q", **{"x-message-ttl": 100})
    queue.push(msg("a"))
    queue.push(msg("b"))
    timers.t += 0.2  # the timer has not run yet
    consumer = Sink()
    queue.add_consumer(consumer)
    assert consumer.got == []
    assert queue.message_count == 0


def test_a_ready_consumer_gets_even_a_ttl_0_message(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q", **{"x-message-ttl": 0})
    queue.push(msg("nobody"))
    assert queue.message_count == 0 and queue.stats_expired == 1
    consumer = Sink()
    queue.add_consumer(consumer)
    queue.push(msg("straight"))
    assert consumer.bodies() == [b"straight"]


def test_per_message_expiration(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q")
    queue.push(msg("short", expiration="100"))
    queue.push(msg("forever"))
    timers.advance(0.15)
    assert bodies(queue) == [b"forever"]


@pytest.mark.parametrize(
    ("queue_ttl", "expiration", "lives"),
    [(1000, "100", 0.1), (100, "1000", 0.1), (None, "250", 0.25), (250, None, 0.25)],
)
def test_the_smaller_of_queue_and_message_ttl_wins(
    vhost: VirtualHost,
    timers: FakeTimers,
    queue_ttl: int | None,
    expiration: str | None,
    lives: float,
) -> None:
    args = {} if queue_ttl is None else {"x-message-ttl": queue_ttl}
    queue = declare(vhost, "q", **args)
    queue.push(msg("m", expiration=expiration))
    timers.advance(lives - 0.01)
    assert queue.message_count == 1
    timers.advance(0.02)
    assert queue.message_count == 0


def test_a_short_lived_message_behind_a_long_lived_head_waits_for_the_head(
    vhost: VirtualHost, timers: FakeTimers
) -> None:
    """RabbitMQ expires from the head only: no scan of the queue."""
    queue = declare(vhost, "q")
    queue.push(msg("long", expiration="10000"))
    queue.push(msg("short", expiration="100"))
    timers.advance(1.0)
    assert bodies(queue) == [b"long", b"short"]  # still counted, not delivered later
    consumer = Sink()
    queue.add_consumer(consumer)
    assert consumer.bodies() == [b"long"]  # "short" expired on reaching the head
    assert queue.message_count == 0 and queue.stats_expired == 1


def test_requeued_messages_keep_their_deadline(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q", **{"x-message-ttl": 1000})
    queue.push(msg("a"))
    queue.push(msg("b"))
    got = queue.take()
    assert got is not None
    timers.advance(1.5)  # "b" expires in the queue; "a" is out, unacked
    assert queue.message_count == 0 and queue.stats_expired == 1
    queue.requeue([got[0]])  # back past its deadline: dropped, not delivered again
    assert queue.message_count == 0 and queue.stats_expired == 2
    assert queue._deadlines == {} and queue._positions == {}


def test_acked_messages_leave_no_deadline_behind(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q", **{"x-message-ttl": 1000})
    consumer = Sink()
    queue.add_consumer(consumer)
    queue.push(msg("a"))
    assert queue._deadlines  # kept while unacked: a requeue would need it
    queue.ack(consumer.take(b"a"))
    assert queue._deadlines == {} and queue._positions == {}


def test_no_ttl_costs_no_deadline_and_no_timer(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q")
    consumer = Sink(prefetch=1)
    queue.add_consumer(consumer)
    for i in range(10):
        queue.push(msg(str(i)))
    assert queue._deadlines == {} and timers.handles == []


def test_a_requeue_ahead_of_the_timer_moves_it_earlier(
    vhost: VirtualHost, timers: FakeTimers
) -> None:
    queue = declare(vhost, "q", **{"x-message-ttl": 1000})
    queue.push(msg("a"))
    got = queue.take()
    assert got is not None
    timers.advance(0.5)
    queue.push(msg("b"))  # the head now: its timer is due at 1.5
    queue.requeue([got[0]])  # "a" is the head again, due at 1.0
    timers.advance(0.6)
    assert bodies(queue) == [b"b"]


def test_x_expires_deletes_an_unused_queue(vhost: VirtualHost, timers: FakeTimers) -> None:
    declare(vhost, "q", **{"x-expires": 1000})
    timers.advance(0.9)
    assert "q" in vhost.queues
    timers.advance(0.2)
    assert "q" not in vhost.queues


def test_x_expires_counts_from_the_last_use(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q", **{"x-expires": 1000})
    timers.advance(0.8)
    declare(vhost, "q", **{"x-expires": 1000})  # a redeclare is a use
    timers.advance(0.8)
    queue.take()  # so is a basic.get, even of nothing
    timers.advance(0.8)
    vhost.declare_queue("q", connection_id=1, passive=True)
    timers.advance(0.8)
    assert "q" in vhost.queues
    timers.advance(0.3)
    assert "q" not in vhost.queues


def test_x_expires_waits_for_consumers_to_leave(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q", **{"x-expires": 1000})
    consumer = Sink()
    queue.add_consumer(consumer)
    timers.advance(5)
    assert "q" in vhost.queues
    queue.remove_consumer(consumer)
    timers.advance(0.9)
    assert "q" in vhost.queues
    timers.advance(0.2)
    assert "q" not in vhost.queues


def test_a_deleted_queue_stops_its_timers(vhost: VirtualHost, timers: FakeTimers) -> None:
    queue = declare(vhost, "q", **{"x-expires": 1000, "x-message-ttl": 500})
    queue.push(msg("a"))
    assert len(timers.pending) == 2
    vhost.delete_queue("q")
    assert timers.pending == []


def test_a_queue_whose_timers_are_off_sets_no_timer(timers: FakeTimers) -> None:
    """A queue type holding this one turns its timers off while its messages are
    elsewhere (a shared queue another server owns)."""
    queue = Queue("q", "/", arguments={"x-expires": 1000, "x-message-ttl": 10}, timed=False)
    queue.check_unused()
    assert timers.handles == []


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("abc", "no_integer"),
        ("", "no_integer"),
        ("-1", "{value_negative,-1}"),
        ("10s", '{leftover_string,"s"}'),
        ("4294967296", "{value_too_large,4294967296}"),
    ],
)
def test_a_bad_expiration_is_refused_with_rabbitmqs_text(value: str, reason: str) -> None:
    encoded = value.encode()
    raw = b"\x01\x00" + bytes((len(encoded),)) + encoded  # only the expiration flag
    with pytest.raises(ChannelError) as info:
        check_expiration(raw)
    assert info.value.reply_code == 406
    assert info.value.text == f"invalid expiration '{value}': {reason}"


def test_expiration_values() -> None:
    assert parse_expiration(b"0") == 0
    assert parse_expiration(b"+15") == 15
    assert parse_expiration(b"4294967295") == 4294967295
    check_expiration(msg("x", expiration="60000", headers={"a": 1}).props_raw)


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-message-ttl": 4294967296}, "{value_too_large,4294967296}"),
        ({"x-expires": 4294967296}, "{value_too_large,4294967296}"),
        ({"x-message-ttl": -1}, "{value_negative,-1}"),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-message-ttl": "1000"}, '"expected integer, got longstr"'),
    ],
)
def test_bad_ttl_arguments_are_refused(
    vhost: VirtualHost, arguments: dict[str, object], text: str
) -> None:
    with pytest.raises(ChannelError) as info:
        vhost.declare_queue("q", connection_id=1, arguments=arguments)
    assert info.value.reply_code == 406
    key = next(iter(arguments))
    assert info.value.text == f"invalid arg '{key}' for queue 'q' in vhost '/': {text}"


def test_the_expiration_is_found_behind_every_property_before_it() -> None:
    m = msg(
        "x",
        content_type="text/plain",
        content_encoding="utf-8",
        headers={"h": "v"},
        delivery_mode=2,
        priority=3,
        correlation_id="c",
        reply_to="r",
        expiration="42",
        message_id="id",
    )
    assert codec.decode_properties(m.props_raw).expiration == "42"
    from brokerd.wire.tables import expiration

    assert expiration(m.props_raw) == b"42"
