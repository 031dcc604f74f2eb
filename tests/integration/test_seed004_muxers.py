"""Seed 004's muxers over real sockets: x-selector, x-wild-headers, x-lossy and the
DESTINATION -> PROPERTY -> LOSSY -> queue chain, with pika and aio-pika."""

from __future__ import annotations

import decimal

import aio_pika
import pika
import pika.exceptions
import pytest

from tests.brokerd_process import BrokerProcess
from tests.conftest import uid

pytestmark = pytest.mark.integration


def drain(ch, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def test_selector_routes_by_condition(broker: BrokerProcess):
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ex = uid("sel")
        ch.exchange_declare(ex, "x-selector", auto_delete=True)
        big, urgent = uid("big"), uid("urgent")
        for q in (big, urgent):
            ch.queue_declare(q, exclusive=True)
        ch.queue_bind(big, ex, arguments={"x-selector": "amount > 100 AND ccy IN ('EUR','USD')"})
        ch.queue_bind(urgent, ex, arguments={"x-selector": "JMSPriority >= 7 OR desk LIKE 'LD%'"})
        sends = [
            ({"amount": 150, "ccy": "EUR"}, 0, b"1"),  # big
            ({"amount": 150, "ccy": "GBP"}, 0, b"2"),  # neither
            ({"amount": 50}, 9, b"3"),  # urgent by priority
            ({"desk": "LDN", "amount": 500, "ccy": "USD"}, 0, b"4"),  # both
            ({}, 0, b"5"),  # UNKNOWN everywhere: nowhere
        ]
        for headers, priority, body in sends:
            ch.basic_publish(ex, "", body, pika.BasicProperties(headers=headers, priority=priority))
        assert drain(ch, big) == [b"1", b"4"]
        assert drain(ch, urgent) == [b"3", b"4"]


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ("amount >", "syntax error at the end"),
        ("amount >> 5", "column 9"),
        ("'x' + 1 > 0", "arithmetic needs numbers"),
        ("NOT " * 80 + "x", "levels deep"),
        ("x = 'é' OR " * 400 + "x = 1", "bytes, longer than 4096"),
    ],
)
def test_bad_selector_is_406_at_bind_time(broker: BrokerProcess, selector, fragment):
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ex = uid("sel")
        ch.exchange_declare(ex, "x-selector", auto_delete=True)
        q = ch.queue_declare("", exclusive=True).method.queue
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_bind(q, ex, arguments={"x-selector": selector})
        assert info.value.reply_code == 406
        assert "invalid x-selector" in info.value.reply_text
        assert fragment in info.value.reply_text
        assert conn.is_open
        conn.channel().exchange_delete(ex)


async def test_wild_headers_with_aio_pika(broker: BrokerProcess):
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        ex = await channel.declare_exchange(uid("wild"), "x-wild-headers", auto_delete=True)
        forex = await channel.declare_queue(exclusive=True)
        any_q = await channel.declare_queue(exclusive=True)
        await forex.bind(ex, arguments={"topic": "FOREX.*", "x-match": "all"})
        await any_q.bind(ex, arguments={"topic": "BOND.?", "desk": "NY*", "x-match": "any"})
        sends = [("FOREX.EUR.USD", "LDN"), ("BOND.X", "LDN"), ("EQ", "NYC"), ("EQ", "LDN")]
        for topic, desk in sends:
            headers = {"topic": topic, "desk": desk}
            await ex.publish(
                aio_pika.Message(f"{topic}/{desk}".encode(), headers=headers), routing_key=""
            )

        async def bodies(queue) -> list[str]:
            out = []
            while (m := await queue.get(no_ack=True, fail=False)) is not None:
                out.append(m.body.decode())
            return out

        assert await bodies(forex) == ["FOREX.EUR.USD/LDN"]
        assert await bodies(any_q) == ["BOND.X/LDN", "EQ/NYC"]
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            q = await (await connection.channel()).declare_queue(exclusive=True)
            await q.bind(ex, arguments={"x-match": "most"})


@pytest.mark.parametrize("rate", [decimal.Decimal("1.5"), "lots", "-0.5", True])
def test_lossy_bad_rate_is_406_at_declare(broker: BrokerProcess, rate):
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        name = uid("lossy")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.exchange_declare(name, "x-lossy", arguments={"x-loss-rate": rate})
        assert info.value.reply_code == 406
        assert "x-loss-rate" in info.value.reply_text
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            conn.channel().exchange_declare(name, passive=True)
        assert info.value.reply_code == 404  # never created


def _chain_survivors(broker: BrokerProcess) -> list[int]:
    """Seed 004's drawing: queue <- LOSSY <- PROPERTY <- DESTINATION, seed 004."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        dest, prop, lossy = uid("DESTINATION"), uid("PROPERTY"), uid("LOSSY")
        ch.exchange_declare(dest, "direct", auto_delete=True)
        ch.exchange_declare(prop, "headers", auto_delete=True)
        ch.exchange_declare(
            lossy, "x-lossy", auto_delete=True, arguments={"x-loss-rate": "0.4", "x-loss-seed": 4}
        )
        q = ch.queue_declare("", exclusive=True).method.queue
        for key in ("X", "Y", "Z"):
            ch.exchange_bind(prop, dest, key)
        ch.exchange_bind(lossy, prop, "", arguments={"ABC": "yes", "x-match": "all"})
        ch.queue_bind(q, lossy)
        for i in range(300):
            key = "XYZW"[i % 4]  # W matches no DESTINATION binding
            abc = "no" if i % 10 == 9 else "yes"  # some fail the PROPERTY binding
            ch.basic_publish(dest, key, str(i).encode(), pika.BasicProperties(headers={"ABC": abc}))
        got = [int(b) for b in drain(ch, q)]
        for name in (lossy, prop, dest):
            ch.exchange_delete(name)
        return got


def test_seed_004_chain_is_lossy_and_reproducible(broker: BrokerProcess):
    first = _chain_survivors(broker)
    eligible = [i for i in range(300) if i % 4 != 3 and i % 10 != 9]
    assert set(first) <= set(eligible)
    assert 0.45 < len(first) / len(eligible) < 0.75  # about 60% survive a 0.4 loss rate
    assert first == sorted(first)
    assert _chain_survivors(broker) == first  # the same seed drops the same messages
