"""A consumer's connection stops taking deliveries while its own output is full."""

from __future__ import annotations

from pamqp import commands

from brokerd.protocol.connection import OUTPUT_HIGH_WATER
from tests.unit.test_connection_machine import Client, parse, publish_frames


def test_deliveries_pause_at_the_output_high_water_and_resume_after_flush() -> None:
    consumer = Client()
    consumer.handshake()
    consumer.open_channel()
    consumer.send(1, commands.Queue.Declare(queue="bp"))
    consumer.send(1, commands.Basic.Consume(queue="bp", consumer_tag="c", no_ack=True))
    publisher = Client(broker=consumer.broker)
    publisher.handshake()
    publisher.open_channel()

    body = b"x" * 60_000
    count = 2 * OUTPUT_HIGH_WATER // len(body)
    publisher.feed(b"".join(publish_frames(1, "", "bp", body, 131072) for _ in range(count)))
    queue = consumer.broker.vhosts["/"].queues["bp"]
    pending = consumer.conn._out_bytes
    # the buffer stopped growing just past the mark; the rest waits in the queue
    assert OUTPUT_HIGH_WATER < pending < OUTPUT_HIGH_WATER + 2 * len(body)
    assert queue.message_count > 0 and not consumer.conn.writable

    delivered = 0
    for _ in range(10):  # each flush hands over a buffer and lets the queue move on
        delivered += sum(
            isinstance(m, commands.Basic.Deliver) for _, m in parse(consumer.conn.data_to_send())
        )
        if not queue.message_count and not consumer.conn._out:
            break
    delivered += sum(
        isinstance(m, commands.Basic.Deliver) for _, m in parse(consumer.conn.data_to_send())
    )
    assert delivered == count and queue.message_count == 0 and consumer.conn.writable


def test_transport_pause_holds_deliveries_until_resume() -> None:
    consumer = Client()
    consumer.handshake()
    consumer.open_channel()
    consumer.send(1, commands.Queue.Declare(queue="tp"))
    consumer.send(1, commands.Basic.Consume(queue="tp", consumer_tag="c", no_ack=True))
    consumer.conn.pause_writing()
    publisher = Client(broker=consumer.broker)
    publisher.handshake()
    publisher.open_channel()
    publisher.feed(publish_frames(1, "", "tp", b"hello"))
    queue = consumer.broker.vhosts["/"].queues["tp"]
    assert queue.message_count == 1 and consumer.replies() == []
    consumer.conn.resume_writing()
    assert next(type(m) for _, m in consumer.replies()) is commands.Basic.Deliver
    assert queue.message_count == 0
