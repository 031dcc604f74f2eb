"""Requeued messages go back to their original position, as RabbitMQ puts them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.model.vhost import VirtualHost
from tests.support.examples import examples
from tests.unit.queue_support import Sink, bodies, declare, msg


def filled(count: int) -> tuple[VirtualHost, object]:
    vhost = VirtualHost("/")
    queue = declare(vhost, "q")
    for i in range(1, count + 1):
        queue.push(msg(str(i)))
    return vhost, queue


def test_nacking_2_to_5_of_6_returns_them_in_order_ahead_of_6() -> None:
    _, queue = filled(6)
    consumer = Sink(prefetch=5)
    queue.add_consumer(consumer)
    assert consumer.bodies() == [b"1", b"2", b"3", b"4", b"5"]
    queue.requeue(consumer.take(b"2", b"3", b"4", b"5"))  # one nack, multiple=true
    # the freed prefetch takes them again at once, in their order, before 6
    assert consumer.bodies()[5:] == [b"2", b"3", b"4", b"5"]
    assert all(redelivered for _, redelivered in consumer.got[5:])
    assert bodies(queue) == [b"6"]


def test_nacked_messages_wait_in_order_ahead_of_6_without_a_consumer() -> None:
    _, queue = filled(6)
    consumer = Sink(prefetch=5)
    queue.add_consumer(consumer)
    queue.remove_consumer(consumer)
    queue.requeue(consumer.take(b"2", b"3", b"4", b"5"))
    assert bodies(queue) == [b"2", b"3", b"4", b"5", b"6"]
    assert [r for _, r in queue.ready()] == [True, True, True, True, False]


def test_single_nacks_in_reverse_order_still_restore_the_original_order() -> None:
    _, queue = filled(6)
    consumer = Sink(prefetch=5)
    queue.add_consumer(consumer)
    for body in (b"5", b"4", b"3", b"2"):
        queue.requeue(consumer.take(body))
    # the consumer's freed prefetch takes the head each time; what is left is in order
    assert consumer.bodies()[5:] == [b"5", b"4", b"3", b"2"]
    queue.remove_consumer(consumer)
    queue.requeue(consumer.take(b"1", b"5", b"4", b"3", b"2"))
    assert bodies(queue) == [b"1", b"2", b"3", b"4", b"5", b"6"]


def test_redelivery_after_requeue_goes_out_in_position_order() -> None:
    _, queue = filled(6)
    first = Sink(prefetch=6)
    queue.add_consumer(first)
    queue.remove_consumer(first)  # a channel closing with everything unacked
    queue.requeue(first.take(b"6", b"3", b"1", b"4"))
    second = Sink()
    queue.add_consumer(second)
    assert second.bodies() == [b"1", b"3", b"4", b"6"]
    assert all(redelivered for _, redelivered in second.got)


def test_basic_get_requeue_keeps_position_and_counts() -> None:
    _, queue = filled(4)
    got = [queue.take() for _ in range(3)]
    assert [g[2] for g in got if g] == [3, 2, 1]  # messages left after each get
    queue.requeue([got[2][0], got[0][0]])  # 3 and 1
    assert bodies(queue) == [b"1", b"3", b"4"]
    assert queue.message_count == 3
    taken = queue.take()
    assert taken is not None and taken[0].body == b"1" and taken[1] is True


def test_messages_delivered_straight_to_a_consumer_have_positions_too() -> None:
    vhost = VirtualHost("/")
    queue = declare(vhost, "q")
    consumer = Sink(prefetch=2)
    queue.add_consumer(consumer)
    for i in range(1, 5):
        queue.push(msg(str(i)))  # 1, 2 straight to the consumer, 3, 4 queued
    assert consumer.bodies() == [b"1", b"2"]
    queue.remove_consumer(consumer)
    queue.requeue(consumer.take(b"2", b"1"))
    assert bodies(queue) == [b"1", b"2", b"3", b"4"]


def test_a_message_published_while_requeued_ones_wait_goes_behind_them() -> None:
    _, queue = filled(2)
    got = [queue.take(), queue.take()]
    queue.requeue([g[0] for g in got if g])
    consumer = Sink()
    queue.push(msg("3"))  # not straight to a consumer: the requeued ones are ahead
    queue.add_consumer(consumer)
    assert consumer.bodies() == [b"1", b"2", b"3"]


def test_purge_empties_requeued_messages_too() -> None:
    _, queue = filled(3)
    got = queue.take()
    assert got is not None
    queue.requeue([got[0]])
    assert queue.drop_all() == 3
    assert queue.message_count == 0 and bodies(queue) == []
    queue.push(msg("4"))
    assert bodies(queue) == [b"4"]


def test_ack_forgets_positions() -> None:
    _, queue = filled(3)
    consumer = Sink()
    queue.add_consumer(consumer)
    queue.ack(consumer.take(b"1", b"2", b"3"))
    assert queue._positions == {}


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["push", "get", "consume", "cancel", "requeue", "ack", "purge"]),
            st.lists(st.integers(min_value=0, max_value=50), max_size=6),
        ),
        max_size=60,
    )
)
def test_ready_messages_are_always_in_publish_order(ops: list[tuple[str, list[int]]]) -> None:
    """Whatever is delivered, requeued (any subset, in any order) or acked, the ready
    messages stay in publish order, redelivered exactly when they went out before,
    and none is lost or duplicated."""
    vhost = VirtualHost("/")
    queue = declare(vhost, "q")
    consumer = Sink(prefetch=3)
    consuming = False
    held: list = []  # delivered by get, not settled
    published = 0
    acked: set[bytes] = set()
    purged: set[bytes] = set()
    went_out: set[bytes] = set()
    for op, picks in ops:
        if op == "push":
            published += 1
            queue.push(msg(str(published)))
        elif op == "get":
            got = queue.take()
            if got is not None:
                held.append(got[0])
        elif op == "consume" and not consuming:
            queue.add_consumer(consumer)
            consuming = True
        elif op == "cancel" and consuming:
            queue.remove_consumer(consumer)
            consuming = False
        elif op in ("requeue", "ack"):
            pool = held + consumer.unacked
            chosen = []
            for pick in picks:
                if pool:
                    chosen.append(pool.pop(pick % len(pool)))
            for m in chosen:
                if m in held:
                    held.remove(m)
                else:
                    consumer.unacked.remove(m)
            for m in chosen:
                went_out.add(bytes(m.body))
            if op == "ack":
                acked.update(bytes(m.body) for m in chosen)
                queue.ack(chosen)
            else:
                queue.requeue(chosen)
        elif op == "purge":
            purged.update(bodies(queue))
            queue.drop_all()
        ready = queue.ready()
        numbers = [int(m.body) for m, _ in ready]
        assert numbers == sorted(numbers)
        assert queue.message_count == len(ready)
        for m, redelivered in ready:
            assert redelivered == (bytes(m.body) in went_out)
    out = [bytes(m.body) for m in held + consumer.unacked]
    everything = bodies(queue) + out + sorted(acked) + sorted(purged)
    assert sorted(everything, key=int) == [str(i).encode() for i in range(1, published + 1)]
