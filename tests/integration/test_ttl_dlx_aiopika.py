"""TTL, dead-lettering and requeue order as aio-pika applications meet them.

Runs against a standalone brokerd and a non-root cluster server; set
``ROOKERY_REFERENCE_AMQP_PORT`` to run against RabbitMQ 3.10 instead.
"""

from __future__ import annotations

import asyncio
import datetime

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from tests.conftest import uid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_expiration_dead_letters_with_the_original_expiration(
    connection: AbstractRobustConnection,
) -> None:
    channel = await connection.channel()
    dlx = await channel.declare_exchange(uid("dlx"), aio_pika.ExchangeType.DIRECT)
    dead = await channel.declare_queue(uid("dead"))
    await dead.bind(dlx, routing_key=dead.name)
    queue = await channel.declare_queue(
        uid("q"),
        arguments={
            "x-message-ttl": 10_000,
            "x-dead-letter-exchange": dlx.name,
            "x-dead-letter-routing-key": dead.name,
        },
    )
    await channel.default_exchange.publish(
        aio_pika.Message(b"short-lived", headers={"foo": "bar"}, expiration=0.5), queue.name
    )
    arrived: asyncio.Future[AbstractIncomingMessage] = asyncio.get_running_loop().create_future()
    await dead.consume(arrived.set_result, no_ack=True)
    message = await asyncio.wait_for(arrived, 10)
    assert message.body == b"short-lived"
    assert message.routing_key == dead.name and message.exchange == dlx.name
    assert message.expiration is None
    assert message.headers["foo"] == "bar"
    (death,) = message.headers["x-death"]
    assert isinstance(death["time"], datetime.datetime)
    assert {k: v for k, v in death.items() if k != "time"} == {
        "count": 1,
        "reason": "expired",
        "queue": queue.name,
        "exchange": "",
        "routing-keys": [queue.name],
        "original-expiration": "500",
    }
    assert message.headers["x-first-death-reason"] == "expired"


async def test_queue_ttl_dead_letters_through_a_direct_exchange(
    connection: AbstractRobustConnection,
) -> None:
    channel = await connection.channel()
    source = await channel.declare_exchange(uid("direct"), aio_pika.ExchangeType.DIRECT)
    dlx = await channel.declare_exchange(uid("dlx"), aio_pika.ExchangeType.DIRECT)
    key = uid("dlx-key")
    queue = await channel.declare_queue(
        uid("q"),
        arguments={
            "x-message-ttl": 300,
            "x-dead-letter-exchange": dlx.name,
            "x-dead-letter-routing-key": key,
        },
    )
    dead = await channel.declare_queue(uid("dead"))
    await dead.bind(dlx, key)
    await queue.bind(source, "rk")
    await source.publish(aio_pika.Message(b"late"), "rk")
    message = await dead.get(timeout=5, fail=False)
    assert message is None  # not yet: 300 ms
    await asyncio.sleep(0.6)
    message = await dead.get(timeout=5)
    assert message.body == b"late" and message.routing_key == key
    assert message.headers["x-death"][0]["routing-keys"] == ["rk"]
    assert message.headers["x-death"][0]["exchange"] == source.name
    await message.ack()


async def test_unprocessed_messages_of_a_closed_iterator_come_back_in_order(
    connection: AbstractRobustConnection,
) -> None:
    """aio-pika nacks what an iterator still held when it closes: each message
    goes back to its own place, so a later reader sees the original order."""
    channel = await connection.channel()
    queue = await channel.declare_queue(uid("q"))
    bodies = [b"%d" % i for i in range(5)]
    for body in bodies:
        await channel.default_exchange.publish(aio_pika.Message(body), queue.name)
    async with queue.iterator() as iterator:
        first = await iterator.__anext__()
        async with first.process():
            assert first.body == bodies[0]
    for body in bodies[1:]:
        message = await queue.get(timeout=5)
        assert message.body == body
        await message.ack()
    assert await queue.get(fail=False, timeout=0.5) is None


async def test_a_multiple_nack_in_a_consumer_requeues_in_publish_order(
    connection: AbstractRobustConnection,
) -> None:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=5)
    queue = await channel.declare_queue(uid("q"))
    for i in range(1, 7):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), queue.name)
    held: list[AbstractIncomingMessage] = []
    seen: list[tuple[bytes, bool]] = []
    done = asyncio.Event()

    async def handle(message: AbstractIncomingMessage) -> None:
        seen.append((message.body, message.redelivered))
        if len(seen) <= 5:
            held.append(message)
            if len(held) == 5:  # 6 waits: no credit left
                await held[4].nack(multiple=True, requeue=True)  # 1 to 5
        else:
            await message.ack()
            if len(seen) == 11:
                done.set()

    await queue.consume(handle)
    await asyncio.wait_for(done.wait(), 10)
    assert seen[5:] == [(b"%d" % i, True) for i in range(1, 6)] + [(b"6", False)]


async def test_rejected_message_reaches_the_dead_letter_queue(
    connection: AbstractRobustConnection,
) -> None:
    channel = await connection.channel()
    dlx = await channel.declare_exchange(uid("dlx"), aio_pika.ExchangeType.FANOUT)
    dead = await channel.declare_queue(uid("dead"))
    await dead.bind(dlx)
    queue = await channel.declare_queue(uid("q"), arguments={"x-dead-letter-exchange": dlx.name})
    await channel.default_exchange.publish(aio_pika.Message(b"bad", priority=4), queue.name)
    message = await queue.get(timeout=5)
    await message.reject(requeue=False)
    for _ in range(50):
        dead_message = await dead.get(fail=False, timeout=5)
        if dead_message is not None:
            break
        await asyncio.sleep(0.1)
    assert dead_message is not None
    assert dead_message.body == b"bad" and dead_message.priority == 4
    assert dead_message.redelivered is False
    (death,) = dead_message.headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", queue.name, 1)
    await dead_message.ack()
