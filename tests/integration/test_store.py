"""The disk store with a real brokerd: durable wiring and persistent messages survive
SIGTERM and kill -9, confirms wait for the disk, flow to disk keeps memory bounded."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import AMQPConnectionError, ChannelClosedByBroker

from tests.brokerd_process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "b").start()
    try:
        yield proc
    finally:
        proc.stop()


def connect(proc: BrokerProcess) -> BlockingConnection:
    return BlockingConnection(pika.ConnectionParameters("127.0.0.1", proc.port))


def restart(proc: BrokerProcess, *, kill: bool) -> BrokerProcess:
    """Stop (SIGTERM, or SIGKILL) and start again on the same port and data directory."""
    assert proc.proc is not None
    if kill:
        proc.proc.kill()
        proc.proc.wait(10)
    else:
        assert proc.stop() == 0
    return proc.start()


def depth(proc: BrokerProcess, queue: str) -> int:
    with connect(proc) as conn:
        return conn.channel().queue_declare(queue, passive=True).method.message_count


def missing(proc: BrokerProcess, kind: str, name: str) -> bool:
    with connect(proc) as conn:
        ch = conn.channel()
        try:
            if kind == "queue":
                ch.queue_declare(name, passive=True)
            else:
                ch.exchange_declare(name, passive=True)
        except ChannelClosedByBroker as exc:
            return exc.reply_code == 404
    return False


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "kill-9"])
def test_durable_wiring_survives_and_the_rest_does_not(broker: BrokerProcess, kill: bool) -> None:
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare("d.topic", "topic", durable=True, arguments={"note": b"\x00\xffbin"})
        ch.exchange_declare("t.fanout", "fanout", durable=False)
        ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 100})
        ch.queue_declare("t.q", durable=False)
        ch.queue_bind("d.q", "d.topic", "a.#")
        ch.exchange_bind("t.fanout", "d.topic", "x")  # a transient end: not kept
        ch.confirm_delivery()
        ch.basic_publish("d.topic", "a.b", b"kept", PERSISTENT)
        ch.basic_publish("d.topic", "a.c", b"transient message")  # delivery mode 1
        ch.basic_publish("", "t.q", b"gone", PERSISTENT)  # a transient queue
    broker = restart(broker, kill=kill)
    assert missing(broker, "exchange", "t.fanout") and missing(broker, "queue", "t.q")
    assert depth(broker, "d.q") == 1
    with connect(broker) as conn:
        ch = conn.channel()
        ok = ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 100})
        assert ok.method.message_count == 1  # same arguments: still equivalent
        ch.confirm_delivery()
        ch.basic_publish("d.topic", "a.z", b"routed", PERSISTENT)  # the binding is back
        assert [ch.basic_get("d.q", auto_ack=True)[2] for _ in range(2)] == [b"kept", b"routed"]


def test_kill_9_during_a_confirmed_stream_loses_nothing_confirmed(broker: BrokerProcess) -> None:
    """Publisher with confirms and a consumer acking one message in two; kill -9 midway.
    After the restart: every confirmed message is there exactly once unless it was
    acked; acked ones stay gone; delivered-unacked ones come back redelivered."""
    with connect(broker) as conn:
        conn.channel().queue_declare("stream", durable=True)
    confirmed: list[int] = []
    acked: set[int] = set()
    delivered: set[int] = set()
    stop = threading.Event()
    killed = threading.Event()
    #: what ended each client early: only the broker's death may
    failures: list[str] = []

    def ended(who: str, exc: Exception) -> None:
        if not (killed.is_set() and isinstance(exc, AMQPConnectionError | ConnectionError)):
            failures.append(f"{who}: {exc!r}")

    def publisher() -> None:
        try:
            conn = connect(broker)
            ch = conn.channel()
            ch.confirm_delivery()
            n = 0
            while not stop.is_set():
                n += 1
                ch.basic_publish("", "stream", b"%d" % n, PERSISTENT)
                confirmed.append(n)
        except Exception as exc:
            ended("publisher", exc)

    def consumer() -> None:
        try:
            conn = connect(broker)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)

            def on(ch: object, method: object, props: object, body: bytes) -> None:
                n = int(body)
                delivered.add(n)
                if n % 2 == 0:
                    ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
                    acked.add(n)

            ch.basic_consume("stream", on)
            while not stop.is_set():
                conn.process_data_events(time_limit=0.05)
        except Exception as exc:
            ended("consumer", exc)

    threads = [threading.Thread(target=publisher), threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    # acks are settled in the journal within a commit round: let the last ones land,
    # then count only what was acked before that
    settled_acks = set(acked)
    time.sleep(0.3)
    assert broker.proc is not None
    killed.set()
    broker.proc.kill()
    stop.set()
    for t in threads:
        t.join(10)
    broker.proc.wait(10)
    assert failures == [], failures
    assert len(confirmed) > 100, "the stream did not get going"
    assert settled_acks, "the consumer acked nothing before the kill"
    broker = broker.start()
    seen: dict[int, bool] = {}
    with connect(broker) as conn:
        ch = conn.channel()
        while True:
            method, _props, body = ch.basic_get("stream", auto_ack=True)
            if method is None:
                break
            n = int(body)
            assert n not in seen, f"{n} recovered twice"
            seen[n] = method.redelivered
    lost = [n for n in confirmed if n not in seen and n not in acked]
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {lost[:5]}"
    back = [n for n in settled_acks if n in seen]
    assert not back, f"acked messages came back: {back[:5]}"
    unflagged = [n for n in delivered - acked if n in seen and not seen[n]]
    assert not unflagged, f"delivered-unacked came back without redelivered: {unflagged[:5]}"


def test_a_confirm_waits_for_the_disk(broker: BrokerProcess) -> None:
    """The journal's commit counter moves for a persistent publish on a durable queue
    (the confirm follows it), and not for a transient one."""
    from brokerd.server.control import request

    def commits() -> int:
        return int(request(broker.data_dir, "status")["result"]["store"]["commits"])

    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare("c.q", durable=True)
        ch.confirm_delivery()
        before = commits()
        ch.basic_publish("", "c.q", b"transient")
        assert commits() == before
        ch.basic_publish("", "c.q", b"persistent", PERSISTENT)
        assert commits() > before


def test_flow_to_disk_holds_a_big_queue_in_bounded_memory(tmp_path: Path) -> None:
    """512 MiB of 256 KiB messages in one queue (transient and persistent mixed) with
    an 8 MiB in-memory limit: RSS stays far below the queue's size, every message
    comes back intact and in order."""
    config = tmp_path / "brokerd.toml"
    config.write_text('[store]\nqueue_memory_limit = "8MiB"\n')
    proc = BrokerProcess(tmp_path / "b", extra_args=["--config", str(config)]).start()
    try:
        body = os.urandom(256 * 1024)
        count = 2048  # 512 MiB
        with connect(proc) as conn:
            ch = conn.channel()
            ch.queue_declare("big", durable=True)
            ch.confirm_delivery()
            for i in range(count):
                props = PERSISTENT if i % 2 else None
                ch.basic_publish("", "big", i.to_bytes(4, "big") + body[4:], props)
        assert depth(proc, "big") == count
        rss = _rss(proc)
        assert rss < 200 * 1024 * 1024, f"RSS {rss >> 20} MiB while holding 512 MiB"
        with connect(proc) as conn:
            ch = conn.channel()
            for i in range(count):
                _method, _props, got = ch.basic_get("big", auto_ack=True)
                assert got[:4] == i.to_bytes(4, "big") and got[4:] == body[4:], i
        assert _peak(proc) < 400 * 1024 * 1024
    finally:
        proc.stop()


def _rss(proc: BrokerProcess) -> int:
    return _status_kib(proc, "VmRSS") * 1024


def _peak(proc: BrokerProcess) -> int:
    return _status_kib(proc, "VmHWM") * 1024


def _status_kib(proc: BrokerProcess, key: str) -> int:
    assert proc.proc is not None
    for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc status")
