"""``brokerd ctl bridges`` on a real standalone brokerd (issue 42): a definition made
for ``rabbitmqctl set_parameter shovel`` works unchanged, ``amqp://`` is this broker,
bridges survive a restart, passwords never show, and ``queue-length`` shovels delete
themselves when done."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.brokerd_process import BrokerProcess
from tests.support.bridges import eventually as waited
from tests.support.bridges import two_brokers

pytestmark = pytest.mark.integration


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with two_brokers(tmp_path, "here", "far") as both:
        yield both


def ctl(proc: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(proc.data_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def status(proc: BrokerProcess) -> list[dict[str, Any]]:
    out = ctl(proc, "bridges", "status", "--json")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["bridges"])


def publish(port: int, queue: str, count: int, start: int = 0) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(start, start + count):
        ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


def depth(port: int, queue: str) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        return conn.channel().queue_declare(queue, durable=True).method.message_count
    finally:
        conn.close()


def eventually(check: Callable[[], bool], timeout: float, what: str, proc: BrokerProcess) -> None:
    waited(check, timeout, what, lambda: status(proc))


def test_a_rabbitmq_shovel_definition_runs_unchanged_and_survives_a_restart(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    here, far = pair
    publish(here.port, "outbox", 500)
    definition = {
        "src-protocol": "amqp091",
        "src-uri": "amqp://",
        "src-queue": "outbox",
        "dest-protocol": "amqp091",
        "dest-uri": f"amqp://guest:guest@127.0.0.1:{far.port}",
        "dest-queue": "inbox",
        "add-forward-headers": True,
        "ack-mode": "on-confirm",
        "reconnect-delay": 1,
    }
    out = ctl(here, "bridges", "set", "to-far", json.dumps(definition))
    assert out.returncode == 0, out.stderr
    assert "guest:guest@" not in out.stdout and "guest:***@" in out.stdout
    eventually(lambda: depth(far.port, "inbox") == 500, 30, "500 shovelled", here)
    (row,) = status(here)
    assert row["state"] == "running" and row["acknowledged"] == 500, row
    assert depth(here.port, "outbox") == 0
    # the backlog: 500 when the bridge declared its source, read again since
    eventually(lambda: status(here)[0]["backlog"] == 0, 15, "the backlog read again", here)
    listed = ctl(here, "bridges", "list")
    assert "guest:***@" in listed.stdout and "guest:guest@" not in listed.stdout
    text = ctl(here, "bridges", "status")
    assert "to-far: running" in text.stdout, text.stdout

    # a restart of the server starts the bridge again
    assert here.stop() == 0
    here.start()
    publish(here.port, "outbox", 100, start=500)
    eventually(lambda: depth(far.port, "inbox") == 600, 30, "100 more after a restart", here)
    assert "guest:guest@" not in here.log_text(), "a password reached the log"

    assert ctl(here, "bridges", "delete", "to-far").returncode == 0
    assert status(here) == []
    assert ctl(here, "bridges", "status").stdout.strip() == "no bridges"


def test_queue_length_shovels_move_the_depth_and_delete_themselves(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    here, far = pair
    publish(here.port, "backlog", 40)
    definition = {
        "src-uri": "amqp://",
        "src-queue": "backlog",
        "dest-uri": far.url,
        "dest-queue": "moved",
        "src-delete-after": "queue-length",
    }
    assert ctl(here, "bridges", "set", "once", json.dumps(definition)).returncode == 0
    eventually(lambda: status(here) == [], 30, "the shovel deleted itself", here)
    assert depth(far.port, "moved") == 40 and depth(here.port, "backlog") == 0
    assert json.loads(ctl(here, "bridges", "list").stdout) == {"bridges": []}


def test_bad_definitions_are_refused_with_the_key_named(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    here, _far = pair
    bad = {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "ack-mod": "no-ack"}
    out = ctl(here, "bridges", "set", "x", json.dumps(bad))
    assert out.returncode == 1 and "ack-mod: unknown key" in out.stderr, out.stderr
    out = ctl(here, "bridges", "set", "x", "{not json")
    assert out.returncode == 1 and "not JSON" in out.stderr
    out = ctl(here, "bridges", "delete", "nothing")
    assert out.returncode == 1 and "no bridge 'nothing'" in out.stderr
    assert status(here) == []


def test_refused_credentials_terminate_the_bridge_and_raise_the_alarm_until_fixed(
    pair: tuple[BrokerProcess, BrokerProcess],
) -> None:
    here, far = pair
    definition = {
        "src-uri": "amqp://",
        "src-queue": "outbox",
        "dest-uri": f"amqp://guest:wrong-pw@127.0.0.1:{far.port}",
        "dest-queue": "inbox",
        "reconnect-delay": 1,
    }
    assert ctl(here, "bridges", "set", "bad", json.dumps(definition)).returncode == 0

    def alarms() -> list[dict[str, Any]]:
        out = ctl(here, "status", "--json")
        assert out.returncode == 0, out.stderr
        return [a for a in json.loads(out.stdout).get("alarms", []) if a["kind"] == "bridge-down"]

    eventually(lambda: bool(alarms()), 20, "the bridge-down alarm", here)
    (row,) = status(here)
    assert row["state"] == "terminated" and "ACCESS_REFUSED" in row["reason"], row
    (alarm,) = alarms()
    assert "bridge bad" in alarm["message"] and "wrong-pw" not in alarm["message"]
    fixed = {**definition, "dest-uri": f"amqp://guest:guest@127.0.0.1:{far.port}"}
    assert ctl(here, "bridges", "set", "bad", json.dumps(fixed)).returncode == 0
    eventually(lambda: status(here)[0]["state"] == "running", 20, "running again", here)
    assert alarms() == []  # cleared once it runs
