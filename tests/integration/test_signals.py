"""Operator signals on a real brokerd: SIGUSR1/SIGUSR2 dumps, SIGTERM shutdown, SIGHUP reload."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands

from brokerd.model.auth import hash_password
from tests.brokerd_process import BrokerProcess
from tests.integration.test_errors import PROTOCOL_HEADER, RawClient

pytestmark = pytest.mark.integration


def wait_for_log(
    broker: BrokerProcess, since: int, done: Callable[[str], bool], timeout: float = 10.0
) -> str:
    """The log written after offset ``since``, once ``done`` holds for it."""
    deadline = time.monotonic() + timeout
    while True:
        text = broker.log_text()[since:]
        if done(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"log never satisfied the condition; new log:\n{text[-4000:]}")
        time.sleep(0.05)


def signal_and_wait(broker: BrokerProcess, sig: int, done: Callable[[str], bool]) -> str:
    since = len(broker.log_text())
    broker.signal(sig)
    return wait_for_log(broker, since, done)


@pytest.fixture
def wired(fresh_broker: BrokerProcess) -> Iterator[tuple[BrokerProcess, pika.BlockingConnection]]:
    """A broker with an exchange, bound queues, ready messages and a consumer holding one."""
    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    ch = conn.channel()
    ch.exchange_declare("sig-x", "topic", durable=False)
    ch.queue_declare("sig-q")
    ch.queue_bind("sig-q", "sig-x", "orders.#")
    ch.queue_bind("sig-q", "amq.headers", arguments={"x-match": "any", "region": "eu"})
    for i in range(3):
        ch.basic_publish("sig-x", "orders.new", f"order-{i}".encode())
    consumer_ch = conn.channel()
    consumer_ch.basic_qos(prefetch_count=1)
    consumer_ch.queue_declare("sig-work")
    consumer_ch.basic_publish("", "sig-work", b"held")
    consumer_ch.basic_publish("", "sig-work", b"waiting")
    received: list[bytes] = []
    consumer_ch.basic_consume(
        "sig-work", lambda c, m, p, body: received.append(body), consumer_tag="sig-consumer"
    )
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert received == [b"held"]  # prefetch 1: one unacked, one still ready
    yield fresh_broker, conn
    if conn.is_open:
        conn.close()


def test_sigusr1_writes_a_full_dump(wired):
    broker, conn = wired
    text = signal_and_wait(broker, signal.SIGUSR1, lambda t: "=== end of dump ===" in t)
    dump = text[text.index("=== brokerd state dump ===") : text.index("=== end of dump ===")]
    lines = dump.splitlines()
    assert len(lines) > 15, dump

    def line(pattern: str) -> str:
        found = [ln for ln in lines if re.search(pattern, ln)]
        assert found, f"no line matching {pattern!r} in dump:\n{dump}"
        return found[0]

    line(r"connections: 1\b")
    conn_line = line(r"connection \d+ peer=127\.0\.0\.1:\d+ user=guest vhost=/ ")
    assert "channels=2" in conn_line
    line(r"channel 1 consumers=0 ")
    assert "unacked=1" in line(r"channel 2 consumers=1 ")
    assert "prefetch=1" in line(r"channel 2 consumers=1 ")
    assert "queue=sig-work" in line(r"consumer sig-consumer ")
    assert "type=topic" in line(r"exchange sig-x ")
    for name, kind in (
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
        ("amq.topic", "topic"),
    ):
        assert f"type={kind}" in line(rf"exchange {re.escape(name)} ")
    assert "ready=3" in line(r"queue sig-q ready=")
    assert "ready=1 consumers=1" in line(r"queue sig-work ready=")
    line(r"binding sig-x -> queue sig-q key='orders\.#'")
    assert "region" in line(r"binding amq\.headers -> queue sig-q")
    # the one-line summary and the cluster view are part of the full dump too
    line(r"spid=\S+ .*connections=1 ")
    line(r"cluster: ")
    assert conn.is_open


def test_sigusr2_writes_one_line(wired):
    broker, conn = wired
    text = signal_and_wait(broker, signal.SIGUSR2, lambda t: "spid=" in t and "\n" in t)
    status = [ln for ln in text.splitlines() if "spid=" in ln]
    assert len(status) == 1, text
    fields = dict(re.findall(r"(\w+)=(\S+)", status[0]))
    for key in ("spid", "connections", "queues", "ready", "unacked", "in", "out"):
        assert key in fields, (key, status[0])
    assert fields["connections"] == "1"
    assert fields["queues"] == "2"
    assert fields["ready"] == "4"  # 3 on sig-q, 1 waiting on sig-work
    assert fields["unacked"] == "1"
    assert re.fullmatch(r"\d+(\.\d+)?/s", fields["in"]), fields["in"]
    assert re.fullmatch(r"\d+(\.\d+)?/s", fields["out"]), fields["out"]
    assert re.fullmatch(r"[\d.]+[KMG]iB/[\d.]+[MGT]iB", fields["mem"]), fields["mem"]
    assert re.fullmatch(r"[\d.]+[KMGT]iB/47\.7MiB", fields["disk_free"]), fields["disk_free"]
    assert fields["alarms"] == "-"
    assert "=== brokerd state dump ===" not in text  # SIGUSR2 is not the full dump
    assert conn.is_open


def test_sigusr2_rates_follow_traffic(fresh_broker: BrokerProcess):
    with pika.BlockingConnection(pika.URLParameters(fresh_broker.url)) as conn:
        ch = conn.channel()
        ch.queue_declare("sig-rate")
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # publish for a few ticker periods
            for _ in range(50):
                ch.basic_publish("", "sig-rate", b"x")
            conn.process_data_events(time_limit=0.02)
        text = signal_and_wait(fresh_broker, signal.SIGUSR2, lambda t: "spid=" in t)
    fields = dict(re.findall(r"(\w+)=(\S+)", text))
    assert float(fields["in"].removesuffix("/s")) > 0, text


def test_sigterm_closes_clients_with_320_and_exits_0(fresh_broker: BrokerProcess):
    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    ch = conn.channel()
    ch.queue_declare("sig-term")
    ch.basic_publish("", "sig-term", b"x")
    other = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    start = time.monotonic()
    fresh_broker.signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        while time.monotonic() - start < 10:
            conn.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320
    assert "CONNECTION_FORCED" in info.value.reply_text
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        while time.monotonic() - start < 10:
            other.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320
    assert fresh_broker.proc is not None
    code = fresh_broker.proc.wait(timeout=8)
    assert code == 0
    assert time.monotonic() - start < 8
    log = fresh_broker.log_text()
    assert "stop requested" in log and "stopped" in log
    assert "Traceback" not in log


def test_sigterm_does_not_wait_for_silent_clients(fresh_broker: BrokerProcess):
    """Clients that never answer close-ok (one mid-handshake, one open) cannot hold the
    shutdown up for long, and a well-behaved client still gets its 320."""
    mid_handshake = RawClient(fresh_broker.port)
    mid_handshake.send(PROTOCOL_HEADER)
    deaf = RawClient(fresh_broker.port)
    deaf.handshake()
    polite = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    try:
        start = time.monotonic()
        fresh_broker.signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            while time.monotonic() - start < 10:
                polite.process_data_events(time_limit=0.1)
        assert info.value.reply_code == 320
        assert fresh_broker.proc is not None
        assert fresh_broker.proc.wait(timeout=12) == 0
        assert time.monotonic() - start < 12
        # the deaf client was told too, before the broker gave up on it
        assert deaf.expect(commands.Connection.Close).reply_code == 320
        deaf.wait_eof()
        mid_handshake.expect(commands.Connection.Start)
        mid_handshake.wait_eof()
    finally:
        mid_handshake.close()
        deaf.close()


# -- SIGHUP ---------------------------------------------------------------------------------------


def config_text(user: str, password: str) -> str:
    return f"""
[limits]
heartbeat = 30

[[vhosts]]
name = "/"

[[users]]
name = "{user}"
password_hash = "{hash_password(password, iterations=1000)}"

[[permissions]]
user = "{user}"
vhost = "/"
"""


def url(broker: BrokerProcess, user: str, password: str) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{broker.port}/"


def can_login(broker: BrokerProcess, user: str, password: str) -> bool:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url(broker, user, password)))
    except pika.exceptions.ProbableAuthenticationError:
        return False
    conn.channel().queue_declare("", exclusive=True)
    conn.close()
    return True


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[tuple[BrokerProcess, Path]]:
    path = tmp_path / "brokerd.toml"
    path.write_text(config_text("alice", "alice-pw"))
    broker = BrokerProcess(tmp_path / "data", extra_args=["--config", str(path)]).start()
    try:
        yield broker, path
    finally:
        code = broker.stop()
        if code not in (0, None):
            print(broker.log_text()[-4000:])


def test_sighup_rereads_the_config(configured):
    broker, path = configured
    assert can_login(broker, "alice", "alice-pw")
    assert not can_login(broker, "bob", "bob-pw")
    assert not can_login(broker, "guest", "guest")  # a file with users has no guest
    held = pika.BlockingConnection(pika.URLParameters(url(broker, "alice", "alice-pw")))

    path.write_text(config_text("bob", "bob-pw"))
    signal_and_wait(broker, signal.SIGHUP, lambda t: "reloaded" in t)
    assert can_login(broker, "bob", "bob-pw")
    assert not can_login(broker, "alice", "alice-pw")
    assert not can_login(broker, "bob", "alice-pw")
    # as in RabbitMQ, connections already open are not cut
    assert held.is_open
    ch = held.channel()
    assert ch.is_open
    # ... but each operation is checked against the permissions in force: alice has none
    # now, and a server-named queue needs configure too (as in RabbitMQ)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("", exclusive=True)
    assert info.value.reply_code == 403
    assert held.is_open
    held.close()
    assert broker.alive()


def test_sighup_with_a_broken_config_keeps_the_old_one(configured):
    broker, path = configured
    path.write_text('[[users]]\nname = "mallory"\n')  # no password hash
    text = signal_and_wait(broker, signal.SIGHUP, lambda t: "reload failed" in t)
    assert "password_hash" in text
    assert can_login(broker, "alice", "alice-pw")
    path.write_text("this is [not toml")
    text = signal_and_wait(broker, signal.SIGHUP, lambda t: "reload failed" in t)
    assert "not valid TOML" in text
    path.unlink()
    signal_and_wait(broker, signal.SIGHUP, lambda t: "reload failed" in t)
    assert can_login(broker, "alice", "alice-pw")
    assert broker.alive()


def test_sighup_with_a_wrongly_shaped_config_keeps_the_old_one(configured):
    broker, path = configured
    path.write_text('users = ["not-a-table"]\n')
    signal_and_wait(broker, signal.SIGHUP, lambda t: "reload failed" in t)
    assert can_login(broker, "alice", "alice-pw")
    assert broker.alive()


def test_bad_config_at_start_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "brokerd.toml"
    path.write_text("[limits]\nframe_max = 12\n")
    broker = BrokerProcess(tmp_path / "data", extra_args=["--config", str(path)])
    with pytest.raises(RuntimeError, match="exited with 2"):
        broker.start()
    assert "frame_max must be at least 4096" in broker.log_text()
    assert "Traceback" not in broker.log_text()
    assert broker.proc is not None
    try:
        broker.proc.wait(5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        broker.proc.kill()


def test_a_signal_the_moment_the_port_listens_is_handled(tmp_path: Path) -> None:
    """The handlers are in place before the port listens. A SIGHUP sent the moment a
    connection is first accepted reloads the configuration; it used to be able to
    land between the listen and the handlers and end the broker (CI, under load)."""
    path = tmp_path / "brokerd.toml"
    path.write_text(config_text("alice", "alice-pw"))
    broker = BrokerProcess(tmp_path / "data", extra_args=["--config", str(path)]).spawn()
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", broker.port), timeout=0.2).close()
                break
            except OSError:
                assert broker.alive() and time.monotonic() < deadline, broker.log_text()
                time.sleep(0.001)
        broker.signal(signal.SIGHUP)
        wait_for_log(broker, 0, lambda text: "reloaded config=" in text)
        assert broker.alive()
    finally:
        assert broker.stop() == 0, broker.log_text()
