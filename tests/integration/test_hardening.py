"""Issue 14's hostile inputs and RabbitMQ behaviours on a real brokerd: byte-cut error
texts for non-ASCII names (also before login), the hostile topic pattern, the login
flood, searched permissions, server-named queues, unbind of gone wiring, update-secret."""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import commands

from brokerd.model.auth import hash_password
from tests.brokerd_process import BrokerProcess
from tests.conftest import uid
from tests.integration.test_errors import PROTOCOL_HEADER, RawClient, raw_frame
from tests.unit.test_connection_machine import unchecked

pytestmark = pytest.mark.integration


@pytest.fixture
def opened(broker: BrokerProcess) -> Iterator[RawClient]:
    with RawClient(broker.port) as client:
        client.handshake()
        client.open_channel(1)
        yield client


@pytest.mark.parametrize("name", ["é" * 127, "✓" * 85, "队列" * 42])
def test_non_ascii_name_in_an_error_closes_the_channel_properly(opened, name):
    opened.send_frames((1, unchecked(commands.Queue.Declare, queue=name, passive=True)))
    close = opened.expect(commands.Channel.Close, channel=1)
    assert close.reply_code == 404
    assert close.reply_text.startswith("NOT_FOUND - no queue '")
    assert len(close.reply_text.encode()) <= 255
    opened.send_frames((1, commands.Channel.CloseOk()))
    opened.open_channel(2)  # the connection lives on


def _start_ok_payload(mechanism: bytes, response: bytes) -> bytes:
    """connection.start-ok built by hand: pamqp would refuse these names client-side."""
    return (
        struct.pack("!HH", 10, 11)
        + struct.pack("!I", 0)  # empty client-properties table
        + bytes([len(mechanism)])
        + mechanism
        + struct.pack("!I", len(response))
        + response
        + b"\x05en_US"
    )


def test_non_ascii_mechanism_before_login_gets_a_close_code(broker: BrokerProcess):
    with RawClient(broker.port) as raw:
        raw.send(PROTOCOL_HEADER)
        raw.expect(commands.Connection.Start)
        raw.send(raw_frame(1, 0, _start_ok_payload(("é" * 127).encode(), b"\0guest\0guest")))
        close = raw.expect(commands.Connection.Close)
        assert close.reply_code == 403
        assert "unsupported authentication mechanism" in close.reply_text
        assert len(close.reply_text.encode()) <= 255
        raw.wait_eof()


def test_invalid_utf8_before_login_gets_a_close_code(broker: BrokerProcess):
    with RawClient(broker.port) as raw:
        raw.send(PROTOCOL_HEADER)
        raw.expect(commands.Connection.Start)
        raw.send(raw_frame(1, 0, _start_ok_payload(b"\xff\xfePLAIN", b"\0guest\0guest")))
        close = raw.expect(commands.Connection.Close)
        assert close.reply_code in (403, 502)
        raw.wait_eof()
    assert "Traceback" not in broker.log_text()


def test_hostile_topic_pattern_routes_at_once(broker: BrokerProcess):
    """The trie's bound on work is asserted in tests/unit/test_seed004_muxers.py; here
    the same pattern and key go through a real broker while another client waits."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ex = uid("topic")
        ch.exchange_declare(ex, "topic", auto_delete=True)
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, ex, "#.#.#.#.#.#.#.#")
        ch.queue_bind(q, ex, "#.a.#.a.#.a.#.a.#.b")
        key = ".".join(["a"] * 100)
        for _ in range(20):
            ch.basic_publish(ex, key, b"x")  # confirmed: routed before the ack
        assert ch.queue_declare(q, passive=True).method.message_count == 20


def _refused_login(port: int, user: str, password: str) -> float:
    """Seconds from start-ok to the server's answer to a bad login."""
    with RawClient(port, timeout=30) as raw:
        raw.send(PROTOCOL_HEADER)
        raw.expect(commands.Connection.Start)
        start = time.monotonic()
        raw.send_frames(
            (
                0,
                commands.Connection.StartOk(
                    client_properties={"capabilities": {"authentication_failure_close": True}},
                    mechanism="PLAIN",
                    response=f"\0{user}\0{password}",
                ),
            )
        )
        got = raw.next_frame(timeout=30)
        elapsed = time.monotonic() - start
        assert got is None or isinstance(got[1], commands.Connection.Close)
        if got is not None:
            assert got[1].reply_code == 403
        return elapsed


@pytest.fixture
def slow_hash_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose user has a realistic (slow) hash, as production would."""
    config = tmp_path / "brokerd.toml"
    config.write_text(
        f"""
[[users]]
name = "app"
password_hash = "{hash_password("secret")}"

[[permissions]]
user = "app"
vhost = "/"
configure = "^app\\\\."
write = "^app\\\\."
read = "^(app\\\\.|amq\\\\.gen-)"
"""
    )
    proc = BrokerProcess(tmp_path / "data", extra_args=["--config", str(config)]).start()
    try:
        yield proc
    finally:
        proc.stop()


def test_login_flood_is_throttled_and_spares_other_clients(slow_hash_broker: BrokerProcess):
    port = slow_hash_broker.port
    url = f"amqp://app:secret@127.0.0.1:{port}/"
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        ch = conn.channel()
        q = ch.queue_declare("app.rtt", exclusive=True).method.queue

        def rtts(n: int) -> list[float]:
            out = []
            for _ in range(n):
                start = time.monotonic()
                ch.queue_declare(q, passive=True)
                out.append(time.monotonic() - start)
            return out

        quiet = statistics.median(rtts(20))
        # the same (address, user) key gets slower answers as failures pile up
        serial = [_refused_login(port, "app", f"guess-{i}") for i in range(6)]
        assert serial[-1] > serial[0] + 0.5, serial
        # a parallel flood: the checks run off the loop, queue behind each other and
        # their refusals are held back, while the open connection keeps answering
        # (with the hash on the event loop, 40 x ~50 ms stalled every client)
        flood = [
            threading.Thread(target=_refused_login, args=(port, user, f"p{i}"))
            for i in range(40)
            for user in ("app", "nobody")
        ]
        for t in flood:
            t.start()
        during = statistics.median(rtts(30))
        for t in flood:
            t.join(60)
        assert during < max(10 * quiet, 0.05), (quiet, during)
    log = slow_hash_broker.log_text()
    assert "user 'nobody' does not exist" in log
    assert "invalid credentials for user 'app'" in log


def test_unknown_user_answers_as_slowly_as_a_wrong_password(slow_hash_broker: BrokerProcess):
    port = slow_hash_broker.port
    # fresh keys each time, so the throttle adds nothing
    wrong = min(_refused_login(port, "app", "x") for _ in range(1))
    unknown = min(_refused_login(port, f"ghost{i}", "x") for i in range(3))
    assert unknown > 0.5 * wrong, (wrong, unknown)


def test_permissions_are_searched_and_server_named_queues_checked(
    slow_hash_broker: BrokerProcess,
):
    url = f"amqp://app:secret@127.0.0.1:{slow_hash_broker.port}/"
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        ch = conn.channel()
        assert ch.queue_declare("app.orders", exclusive=True).method.queue == "app.orders"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("billing.orders")
        assert info.value.reply_code == 403
        # a server-named queue is amq.gen-*: configure '^app\.' does not grant it
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("", exclusive=True)
        assert info.value.reply_code == 403
        assert "amq.gen-" in info.value.reply_text


def test_unbind_of_gone_queue_or_exchange_is_ok(broker: BrokerProcess):
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.queue_unbind(uid("gone-q"), "amq.direct", "k")
        ch.queue_unbind(uid("gone-q"), uid("gone-x"), "k")
        ch.exchange_unbind(uid("gone-x"), "amq.direct", "k")
        ch.exchange_unbind("amq.direct", uid("gone-x"), "k")
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_unbind(q, uid("gone-x"), "k")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_bind(q, uid("gone-x"), "k")  # binding still needs the exchange
        assert info.value.reply_code == 404


async def test_aio_pika_rpc_close_after_its_queue_is_gone(broker: BrokerProcess):
    from aio_pika.patterns import RPC

    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        rpc = await RPC.create(channel)

        async def double(*, x: int) -> int:
            return 2 * x

        await rpc.register("double", double, auto_delete=True)
        assert await rpc.proxy.double(x=21) == 42
        await rpc.close()  # unbinds after the auto-delete reply queue went: no 404
        assert not channel.is_closed


def test_update_secret_with_pika(broker: BrokerProcess):
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        conn.update_secret("guest", "rotation")
        conn.update_secret("new_secret", "reason")  # RabbitMQ's internal users accept any
        assert conn.is_open and ch.is_open
        assert ch.queue_declare("", exclusive=True).method.queue


def test_pipelined_handshake_waits_for_the_password_check(broker: BrokerProcess):
    """start-ok, tune-ok, open and channel.open in one write: answered in order."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        raw = RawClient.__new__(RawClient)
        raw.sock, raw.buf, raw.eof = sock, b"", False
        raw.send(PROTOCOL_HEADER)
        raw.expect(commands.Connection.Start)
        raw.send_frames(
            (
                0,
                commands.Connection.StartOk(
                    client_properties={}, mechanism="PLAIN", response="\0guest\0guest"
                ),
            ),
            (0, commands.Connection.TuneOk(2047, 131072, 0)),
            (0, commands.Connection.Open("/")),
            (1, commands.Channel.Open()),
        )
        raw.expect(commands.Connection.Tune)
        raw.expect(commands.Connection.OpenOk)
        raw.expect(commands.Channel.OpenOk, channel=1)
