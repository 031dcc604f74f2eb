"""The broker's console link against a real brokerd and a websocket server playing the console."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from brokerd.configdoc import document_checksum, validate_document
from brokerd.model.auth import hash_password
from tests.brokerd_process import BrokerProcess
from tests.cluster_harness import Cluster
from tests.support.console_fake import TOKEN, FakeConsole
from tests.support.eventually import eventually


@pytest.fixture
def console() -> Iterator[FakeConsole]:
    fake = FakeConsole().start()
    yield fake
    fake.stop()


def start_broker(
    path: Path, console: FakeConsole, *extra: str, token: str = TOKEN
) -> BrokerProcess:
    return BrokerProcess(
        path, extra_args=["--console", console.url, f"--console-token={token}", *extra]
    ).start()


@pytest.fixture
def linked(tmp_path: Path, console: FakeConsole) -> Iterator[BrokerProcess]:
    proc = start_broker(tmp_path / "b", console)
    console.wait_for(lambda: console.messages("status"), what="first status")
    yield proc
    proc.stop()


def amqp(
    proc: BrokerProcess, user: str = "guest", password: str = "guest"
) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1", proc.port, credentials=pika.PlainCredentials(user, password)
    )
    return pika.BlockingConnection(params)


def queue_names(status: dict[str, Any]) -> list[str]:
    return [q["name"] for q in status["queues"]]


def test_hello_then_full_status_then_deltas(linked: BrokerProcess, console: FakeConsole):
    [hello] = console.messages("hello")
    assert hello["v"] == 1
    assert hello["name"] == hello["address"] == f"127.0.0.1:{linked.port}"
    assert hello["broker_type"] == "standalone"
    assert hello["spid"] and hello["version"] and hello["start_time"] <= time.time()
    assert hello["cluster"] is None and hello["checksum"] is None
    assert hello["heartbeat_interval"] == 1.0
    assert hello["config_version"] is None and hello["config_checksum"] is None
    first = console.messages("status")[0]
    assert first["seq"] == 1 and first["full"] is True
    assert "amq.topic" in [e["name"] for e in first["exchanges"]]
    assert console.attempts[0][1] == f"Bearer {TOKEN}"

    with amqp(linked) as conn:
        channel = conn.channel()
        channel.queue_declare("cl.q1")
        channel.queue_bind("cl.q1", "amq.topic", "cl.#")
        channel.basic_publish("amq.topic", "cl.x", b"hello")
        last = console.messages("status")[-1]["seq"]

        def upserted() -> dict | None:
            for s in console.statuses_after(last):
                if s["full"]:
                    continue
                for q in s["queues"]["upsert"]:
                    if q["name"] == "cl.q1" and q["messages"] == 1:
                        return s
            return None

        delta = console.wait_for(upserted, what="delta with cl.q1")
        assert delta["counts"]["queues"] >= 1
        assert delta["totals"]["published"] >= 1 and delta["totals"]["routed"] >= 1
        entry = next(q for q in delta["queues"]["upsert"] if q["name"] == "cl.q1")
        assert entry["enqueued"] == 1 and entry["shared"] is False
        # the binding shows up once, then a delta is quiet about it
        seqs = [s["seq"] for s in console.messages("status")]
        assert seqs == list(range(1, len(seqs) + 1))  # no gaps

        channel.queue_delete("cl.q1")
        last = console.messages("status")[-1]["seq"]
        removed = console.wait_for(
            lambda: [
                s
                for s in console.statuses_after(last)
                if not s["full"] and ["/", "cl.q1"] in s["queues"]["remove"]
            ],
            what="delta removing cl.q1",
        )
        assert ["/", "amq.topic", "cl.q1", "queue", "cl.#"] in removed[0]["bindings"]["remove"]

    last = console.messages("status")[-1]["seq"]
    console.send({"type": "resync"})
    resynced = console.wait_for(
        lambda: [s for s in console.statuses_after(last) if s["full"]], what="full status"
    )
    assert isinstance(resynced[0]["queues"], list)
    assert "cl.q1" not in queue_names(resynced[0])


def test_delivered_and_acked_totals_and_unacked(linked: BrokerProcess, console: FakeConsole):
    with amqp(linked) as conn:
        channel = conn.channel()
        channel.queue_declare("cl.acks")
        for i in range(3):
            channel.basic_publish("", "cl.acks", b"m%d" % i)
        tags = []
        for _ in range(3):
            method, _props, _body = channel.basic_get("cl.acks")
            tags.append(method.delivery_tag)
        channel.basic_ack(tags[0])
        last = console.messages("status")[-1]["seq"]

        def settled() -> dict | None:
            for s in console.statuses_after(last):
                if s["totals"]["acked"] >= 1 and s["counts"]["messages_unacked"] == 2:
                    return s
            return None

        status = console.wait_for(settled, what="status with 2 unacked")
        assert status["totals"]["delivered"] >= 3
        assert status["counts"]["channels"] >= 1
        console.send({"type": "resync"})
        last = status["seq"]
        full = console.wait_for(
            lambda: [s for s in console.statuses_after(last) if s["full"]], what="full status"
        )[0]
        entry = next(q for q in full["queues"] if q["name"] == "cl.acks")
        assert (entry["unacked"], entry["delivered"], entry["messages"]) == (2, 3, 0)


def test_commands_are_acked(linked: BrokerProcess, console: FakeConsole):
    dump = console.command("state.dump")
    assert dump["ok"] and "=== brokerd state dump ===" in dump["result"]["dump"]
    assert dump["error"] is None

    for name in ("root.enable", "root.disable"):
        ack = console.command(name)
        assert ack["ok"] is False and "needs a clustered broker" in ack["error"]

    bad = console.command(
        "config.apply",
        {"version": 1, "config": {"users": [{"name": "x", "password_hash": "plaintext"}]}},
    )
    assert bad["ok"] is False and "users[0].password_hash" in bad["error"]
    bad = console.command("config.apply", {"version": 1, "config": {"heartbeat": {"interval": 0}}})
    assert bad["ok"] is False and "heartbeat.interval" in bad["error"]

    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        amqp(linked, "newbie", "n3wbie-pw")
    config = {
        "vhosts": ["/"],
        "users": [
            {"name": "guest", "password_hash": hash_password("guest"), "tags": ["administrator"]},
            {"name": "newbie", "password_hash": hash_password("n3wbie-pw"), "tags": []},
        ],
        "permissions": [{"user": "guest", "vhost": "/"}, {"user": "newbie", "vhost": "/"}],
    }
    command_id = str(uuid.uuid4())
    ok = console.command("config.apply", {"version": 7, "config": config}, command_id=command_id)
    assert ok["ok"], ok
    checksum = document_checksum(validate_document(config))
    assert ok["result"]["config_version"] == 7
    assert ok["result"]["config_checksum"] == checksum
    assert sorted(ok["result"]["applied"]) == ["permissions", "users", "vhosts"]
    with amqp(linked, "newbie", "n3wbie-pw") as conn:
        conn.channel().queue_declare("cl.newbie", exclusive=True)

    # a retry of the same id is answered, not executed again
    again = console.command("config.apply", {"version": 7, "config": config}, command_id=command_id)
    assert {k: again[k] for k in ("id", "ok", "result")} == {
        k: ok[k] for k in ("id", "ok", "result")
    }
    log = linked.log_text()
    assert log.count("console configuration applied version=7") == 1
    assert "repeated: answering as before" in log

    # the applied version survives a reconnect: the next hello carries it
    hellos = len(console.messages("hello"))
    asyncio.run_coroutine_threadsafe(console.connections[-1].close(1012), console._loop).result(5)
    hello = console.wait_for(lambda: console.messages("hello")[hellos:], timeout=15)[0]
    assert (hello["config_version"], hello["config_checksum"]) == (7, checksum)


def test_malformed_message_closes_with_4400_and_the_broker_reconnects(
    linked: BrokerProcess, console: FakeConsole
):
    ws = console.connections[-1]
    console.send({"type": "command", "command": "state.dump"})  # no id
    console.wait_for(lambda: ws.close_code is not None, what="close")
    assert ws.close_code == 4400
    console.wait_for(lambda: len(console.messages("hello")) == 2, timeout=15, what="new hello")
    assert "malformed" in linked.log_text()


def test_wrong_token_is_retried_with_backoff_and_amqp_keeps_working(
    tmp_path: Path, console: FakeConsole
):
    proc = start_broker(tmp_path / "b", console, token="wrong-token")
    try:
        console.wait_for(lambda: len(console.attempts) >= 4, timeout=15, what="four attempts")
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(console.attempts)]
        # 0.5, 1, 2 s with +-25 % jitter: growing, never hammering
        assert 0.3 <= gaps[0] <= 0.8, gaps
        assert gaps[2] > gaps[0] * 2, gaps
        assert all(header == "Bearer wrong-token" for _, header in console.attempts)
        assert console.messages("hello") == []
        with amqp(proc) as conn:
            channel = conn.channel()
            channel.queue_declare("cl.works")
            channel.basic_publish("", "cl.works", b"still serving")
            _method, _props, body = channel.basic_get("cl.works", auto_ack=True)
            assert body == b"still serving"
        assert "console refused this broker (HTTP 403)" in proc.log_text()
    finally:
        proc.stop()


def test_console_down_at_start_then_up(tmp_path: Path):
    console = FakeConsole()
    proc = start_broker(tmp_path / "b", console)
    try:
        eventually(lambda: "console link down" in proc.log_text(), 5, "the link down line")
        with amqp(proc) as conn:
            conn.channel().queue_declare("cl.alone")
        console.start()
        # backoff is at most 15 s (+25 %); after its first failures the next try is within ~5 s
        hello = console.wait_for(lambda: console.messages("hello"), timeout=10, what="hello")[0]
        assert hello["name"] == f"127.0.0.1:{proc.port}"
        console.wait_for(lambda: console.messages("status"), what="status")
        assert "cl.alone" in queue_names(console.messages("status")[0])
    finally:
        proc.stop()
        console.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--console", "http://127.0.0.1:1/", "--console-token", "t"], "ws:// or wss://"),
        (["--console", "ws://127.0.0.1:1/"], "needs a token"),
        (["--console-token", "t"], "--console-token needs --console"),
    ],
)
def test_bad_console_options_exit_2(tmp_path: Path, args: list[str], message: str):
    proc = BrokerProcess(tmp_path / "b", extra_args=args)
    with pytest.raises(RuntimeError, match="exited with 2"):
        proc.start()
    assert message in proc.log_text()


def test_token_from_the_environment(tmp_path: Path, console: FakeConsole, monkeypatch):
    monkeypatch.setenv("ROOKERY_CONSOLE_TOKEN", TOKEN)
    proc = BrokerProcess(tmp_path / "b", extra_args=["--console", console.url]).start()
    try:
        console.wait_for(lambda: console.messages("hello"), what="hello")
        assert console.attempts[-1][1] == f"Bearer {TOKEN}"
    finally:
        proc.stop()


def test_cluster_heartbeat_change_is_applied_live(tmp_path: Path, console: FakeConsole):
    cluster = Cluster(tmp_path, primaries=3, secondaries=0)
    try:
        console.link_cluster(cluster, 3)
        hellos = console.wait_for(
            lambda: len(console.messages("hello")) == 3 and console.messages("hello")
        )
        assert {h["broker_type"] for h in hellos} == {"primary"}
        assert {h["cluster"] for h in hellos} == {"test"}
        assert {h["heartbeat_interval"] for h in hellos} == {0.3}
        config = {"heartbeat": {"interval": 0.5, "timeout": 2.0, "open_timeout": 8.0}}
        for connection in range(3):
            command_id = str(uuid.uuid4())
            args = {"version": 2, "config": config}
            message = {"type": "command", "id": command_id, "command": "config.apply", "args": args}
            console.send(message, connection=connection)
            ack = console.wait_for(
                lambda cid=command_id: [a for a in console.messages("ack") if a["id"] == cid]
            )[0]
            assert ack["ok"], ack
            assert ack["result"]["applied"] == ["heartbeat"]
        for index in range(3):
            status = cluster.status(index)
            assert status is not None
            assert status["heartbeat"] == {"interval": 0.5, "timeout": 2.0, "open_timeout": 8.0}
            assert status["console"]["config_version"] == 2
        # statuses now follow the new interval, and the cluster keeps its root
        applied_at = time.time()
        time.sleep(2.5)
        assert cluster.wait_until(cluster.agreed_root)
        times = [
            s["time"]
            for s in console.messages("status")
            if s["_connection"] == 0 and s["time"] > applied_at
        ]
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        assert len(gaps) >= 3 and 0.4 <= gaps[len(gaps) // 2] <= 0.7, gaps
        # the cluster's own heartbeats and replication are not client traffic
        last = console.messages("status")[-1]
        assert last["totals"]["published"] == 0 and last["rates"]["published"] == 0, last
    finally:
        cluster.close()


@pytest.mark.parametrize("form", ["spaced", "equals"])
def test_a_token_starting_with_a_dash_is_accepted(tmp_path: Path, form: str):
    """A random token starts with '-' one time in 64: argparse used to read it as an
    option and exit 2 ("expected one argument")."""
    token = "-dash-token-AbC_9"
    console = FakeConsole(token=token).start()
    args = (
        ["--console", console.url, "--console-token", token]
        if form == "spaced"
        else ["--console", console.url, f"--console-token={token}"]
    )
    proc = BrokerProcess(tmp_path / "b", extra_args=args)
    try:
        proc.start()
        console.wait_for(lambda: console.messages("hello"), what="hello")
        assert console.attempts[-1][1] == f"Bearer {token}"
    finally:
        proc.stop()
        console.stop()


def test_an_applied_configuration_survives_a_restart_without_the_console(tmp_path: Path) -> None:
    """Users pushed by the console are kept with the durable wiring: after kill -9 and a
    restart with the console down, the broker runs them at once."""
    console = FakeConsole().start()
    proc = start_broker(tmp_path / "b", console)
    try:
        console.wait_for(lambda: console.messages("status"), what="first status")
        config = {
            "vhosts": ["/"],
            "users": [
                {"name": "guest", "password_hash": hash_password("guest"), "tags": []},
                {"name": "kept", "password_hash": hash_password("k3pt-pw"), "tags": []},
            ],
            "permissions": [{"user": "guest", "vhost": "/"}, {"user": "kept", "vhost": "/"}],
        }
        assert console.command("config.apply", {"version": 3, "config": config})["ok"]
        console.stop()
        assert proc.proc is not None
        proc.proc.kill()
        proc.proc.wait(10)
        proc.start()
        with amqp(proc, "kept", "k3pt-pw") as conn:
            assert conn.channel().queue_declare("", exclusive=True).method.queue
        assert "stored console configuration version=3 in force" in proc.log_text()
    finally:
        proc.stop()
        console.stop()
