"""brokerd driven by aio-pika (robust connections, confirms, async consumers).

Set ``ROOKERY_REFERENCE_AMQP_PORT=5672`` to run the module-broker tests against
a real RabbitMQ on 127.0.0.1 (guest/guest) and compare.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import aiormq.exceptions
import pytest
from aio_pika.abc import AbstractRobustConnection

from tests.brokerd_process import BrokerProcess
from tests.conftest import uid
from tests.support.aio import robust_connection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def second_connection(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    async for conn in robust_connection(amqp_url):
        yield conn


async def test_declare_bind_publish_with_confirms(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.declare_exchange(uid("x"), aio_pika.ExchangeType.TOPIC)
    queue = await channel.declare_queue(uid("q"), auto_delete=False)
    await queue.bind(exchange, routing_key="events.#")
    for i in range(5):
        confirmation = await exchange.publish(
            aio_pika.Message(
                f"event {i}".encode(),
                headers={"seq": i},
                content_type="text/plain",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=f"events.created.{i}",
        )
        assert isinstance(confirmation, aiormq.spec.Basic.Ack)
    await exchange.publish(aio_pika.Message(b"unrouted"), routing_key="other.key")
    # a robust channel answers passive declares from its cache: ask on a fresh one
    observer = await connection.channel()
    declared = await observer.declare_queue(queue.name, passive=True)
    assert declared.declaration_result.message_count == 5
    message = await queue.get(timeout=5)
    assert message.body == b"event 0"
    assert message.headers == {"seq": 0}
    assert message.content_type == "text/plain"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.routing_key == "events.created.0"
    assert message.exchange == exchange.name
    await message.ack()
    await queue.purge()
    await queue.delete()
    await exchange.delete()


async def test_async_iterator_consume_and_process_acks(
    connection: AbstractRobustConnection,
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(uid("q"))
    for i in range(10):
        await channel.default_exchange.publish(aio_pika.Message(str(i).encode()), queue.name)
    received = []
    async with asyncio.timeout(10), queue.iterator() as messages:
        async for message in messages:
            async with message.process():
                received.append(int(message.body))
            if len(received) == 10:
                break
    assert received == list(range(10))
    # everything was acknowledged: nothing comes back, even on another channel
    other = await connection.channel()
    assert await (await other.get_queue(queue.name)).get(fail=False, timeout=5) is None
    result = await other.declare_queue(queue.name, passive=True)
    assert result.declaration_result.message_count == 0


async def test_process_requeues_on_exception(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(uid("q"))
    await channel.default_exchange.publish(aio_pika.Message(b"fragile"), queue.name)
    message = await queue.get(timeout=5)
    with pytest.raises(RuntimeError):
        async with message.process(requeue=True):
            raise RuntimeError("handler failed")
    again = await queue.get(timeout=5)
    assert again.body == b"fragile"
    assert again.redelivered is True
    await again.ack()


async def test_nack_requeue_sets_redelivered(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=1)
    queue = await channel.declare_queue(uid("q"))
    await channel.default_exchange.publish(aio_pika.Message(b"retry me"), queue.name)
    flags = []
    async with asyncio.timeout(10), queue.iterator() as messages:
        async for message in messages:
            flags.append(message.redelivered)
            if len(flags) == 1:
                await message.nack(requeue=True)
            else:
                await message.ack()
                break
    assert flags == [False, True]


async def test_reject_without_requeue_drops(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(uid("q"))
    await channel.default_exchange.publish(aio_pika.Message(b"bad"), queue.name)
    message = await queue.get(timeout=5)
    await message.reject(requeue=False)
    assert await queue.get(fail=False, timeout=5) is None


async def test_get_empty_and_no_ack(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(uid("q"))
    assert await queue.get(fail=False, timeout=5) is None
    with pytest.raises(aio_pika.exceptions.QueueEmpty):
        await queue.get(timeout=5)
    await channel.default_exchange.publish(aio_pika.Message(b"once"), queue.name)
    message = await queue.get(no_ack=True, timeout=5)
    assert message.body == b"once"
    assert await queue.get(fail=False, timeout=5) is None


async def test_server_named_exclusive_queue(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel(publisher_confirms=False)
    underlay = await channel.get_underlay_channel()  # a robust queue names itself
    declared = await underlay.queue_declare("", exclusive=True)
    assert declared.queue.startswith("amq.gen-")
    await channel.default_exchange.publish(aio_pika.Message(b"x"), declared.queue)
    queue = await channel.get_queue(declared.queue)
    assert (await queue.get(timeout=5)).body == b"x"


async def test_exclusive_queue_locked_from_second_connection(
    connection: AbstractRobustConnection, second_connection: AbstractRobustConnection
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(uid("excl"), exclusive=True)
    other = await second_connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelLockedResource) as info:
        await other.declare_queue(queue.name, exclusive=True)
    assert "RESOURCE_LOCKED" in str(info.value)
    # the owner keeps working; the other connection only lost that channel
    await channel.default_exchange.publish(aio_pika.Message(b"mine"), queue.name)
    assert (await queue.get(timeout=5)).body == b"mine"
    fresh = await second_connection.channel()
    await fresh.declare_queue(uid("q"), auto_delete=True)


async def test_passive_declare_missing_is_404(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as info:
        await channel.get_queue(uid("missing"), ensure=True)
    assert "NOT_FOUND" in str(info.value)
    channel = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await channel.get_exchange(uid("missing"), ensure=True)
    assert not connection.is_closed


async def test_redeclare_mismatch_is_406(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    name = uid("q")
    await channel.declare_queue(name, durable=False)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await channel.declare_queue(name, durable=True)


async def test_confirm_nack_when_queue_full(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(
        uid("full"), arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    ack = await channel.default_exchange.publish(aio_pika.Message(b"fits"), queue.name)
    assert isinstance(ack, aiormq.spec.Basic.Ack)
    with pytest.raises(aiormq.exceptions.DeliveryError) as info:
        await channel.default_exchange.publish(aio_pika.Message(b"overflow"), queue.name)
    assert isinstance(info.value.frame, aiormq.spec.Basic.Nack)
    assert (await queue.get(timeout=5)).body == b"fits"


async def test_mandatory_unroutable_raises(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    with pytest.raises(aiormq.exceptions.PublishError) as info:
        await channel.default_exchange.publish(
            aio_pika.Message(b"nowhere"), uid("no-queue"), mandatory=True
        )
    assert isinstance(info.value.frame, aiormq.spec.Basic.Return)
    assert info.value.frame.reply_code == 312


async def test_prefetch_with_async_consumer(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=2)
    queue = await channel.declare_queue(uid("q"))
    for i in range(6):
        await channel.default_exchange.publish(aio_pika.Message(str(i).encode()), queue.name)
    held: list[aio_pika.abc.AbstractIncomingMessage] = []
    got_two = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        held.append(message)
        if len(held) >= 2:
            got_two.set()

    tag = await queue.consume(on_message)
    await asyncio.wait_for(got_two.wait(), 5)
    await asyncio.sleep(0.5)
    assert [m.body for m in held] == [b"0", b"1"]
    for message in list(held):
        await message.ack()
    async with asyncio.timeout(5):
        while len(held) < 4:
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    assert len(held) == 4
    await queue.cancel(tag)


async def test_server_cancel_when_queue_deleted(
    connection: AbstractRobustConnection, second_connection: AbstractRobustConnection
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(uid("q"), robust=False)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        await message.ack()

    tag = await queue.consume(on_message)
    underlay = await channel.get_underlay_channel()
    assert tag in underlay.consumers
    admin = await second_connection.channel()
    await admin.queue_delete(queue.name)
    # aiormq forgets a consumer when the server's basic.cancel arrives
    async with asyncio.timeout(5):
        while tag in underlay.consumers:
            await asyncio.sleep(0.02)
    assert not channel.is_closed


async def test_robust_connection_recovers_after_broker_restart(fresh_broker: BrokerProcess) -> None:
    conn = await aio_pika.connect_robust(f"{fresh_broker.url}?reconnect_interval=0.2", timeout=10)
    try:
        channel = await conn.channel()
        queue = await channel.declare_queue(uid("robust"), auto_delete=False)
        received: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                await received.put(message.body)

        await queue.consume(on_message)
        await channel.default_exchange.publish(aio_pika.Message(b"before"), queue.name)
        assert await asyncio.wait_for(received.get(), 5) == b"before"

        reconnected = asyncio.Event()
        conn.reconnect_callbacks.add(lambda *_: reconnected.set())
        port = fresh_broker.port
        assert fresh_broker.stop() == 0
        restarted = BrokerProcess(Path(fresh_broker.data_dir), port=port).start()
        try:
            await asyncio.wait_for(reconnected.wait(), 20)
            # the queue and the consumer were declared again by the client
            await channel.default_exchange.publish(aio_pika.Message(b"after"), queue.name)
            assert await asyncio.wait_for(received.get(), 5) == b"after"
        finally:
            await asyncio.wait_for(conn.close(), 10)
            restarted.stop()
    finally:
        if not conn.is_closed:
            await asyncio.wait_for(conn.close(), 10)


async def test_wrong_password_is_refused(amqp_url: str) -> None:
    url = amqp_url.replace("guest:guest", "guest:wrong")
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url, timeout=10)
