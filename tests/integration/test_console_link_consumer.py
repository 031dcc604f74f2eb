"""The broker link through the real ASGI application (Channels' WebsocketCommunicator):
token handshake, hello/welcome, status ingest and resync, commands and acks."""

from __future__ import annotations

import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from clusterapi import commands, configs, consumers, convergence
from clusterapi.models import Alarm, Broker, Command, QueueSnapshot
from tests.support.linkmessages import hello as link_hello

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

TOKEN = "s3cret-broker-token"
NAME = "127.0.0.1:5701"


@pytest.fixture(autouse=True)
def link_settings(settings, monkeypatch) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CONSOLE_BROKER_TOKEN = TOKEN
    # no Celery here: the consumer itself delivers what waits when a broker says hello
    monkeypatch.setattr(commands, "schedule_delivery", lambda command_id: None)
    monkeypatch.setattr(consumers, "_last_refusal_recorded", 0.0)


@pytest.fixture(autouse=True)
async def release_the_database_thread() -> Any:
    """Leave no open connection in Channels' database thread.

    Consumers run their database work (and ``close_old_connections``) in one shared
    thread. Django ignores ``close()`` on the in-memory test database, so the handle
    this test opened there would stay, and a later test without database access
    whose consumer checks old connections in the same thread would trip
    pytest-django's database blocker.
    """
    yield
    await database_sync_to_async(_drop_thread_connections)()


def _drop_thread_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            conn.connection.close()  # the main thread's handle keeps the database alive
            conn.connection = None


def communicator(token: str | None = TOKEN, path: str = "/ws/brokers/") -> WebsocketCommunicator:
    from console.asgi import application

    headers = [(b"host", b"127.0.0.1")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


def hello(**over: Any) -> dict[str, Any]:
    return link_hello(
        NAME, **{"spid": "spid-a", "address": "127.0.0.1:5672", "checksum": None, **over}
    )


def status(seq: int, full: bool, queues: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "status",
        "seq": seq,
        "time": time.time(),
        "full": full,
        "view": {"is_root": True, "ready": True, "root_enabled": True, "quorum": "3/3"},
        "counts": {"connections": 1},
        "totals": {"published": 1, "routed": 1, "delivered": 1},
        "rates": {"published": 0.0, "routed": 0.0, "delivered": 0.0},
        "queues": queues,
    }


def queue(name: str, messages: int = 0) -> dict[str, Any]:
    return {"vhost": "/", "name": name, "messages": messages, "enqueued": 0, "delivered": 0}


async def connected_link() -> WebsocketCommunicator:
    link = communicator()
    accepted, _ = await link.connect()
    assert accepted
    await link.send_json_to(hello())
    welcome = await link.receive_json_from()
    assert welcome == {"v": 1, "type": "welcome", "config_version": None}
    return link


@pytest.mark.parametrize(
    ("setting", "token"),
    [(TOKEN, "wrong"), (TOKEN, None), ("", ""), ("", "anything")],
)
async def test_bad_or_missing_tokens_are_refused_at_the_handshake(settings, setting, token) -> None:
    settings.CONSOLE_BROKER_TOKEN = setting
    link = communicator(token)
    accepted, _ = await link.connect()
    assert accepted is False
    alarm = await database_sync_to_async(Alarm.objects.get)(kind="link.refused")
    assert alarm.active and "refused a broker link" in alarm.message
    assert await database_sync_to_async(Broker.objects.count)() == 0


async def test_hello_status_and_resync() -> None:
    link = await connected_link()
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    assert broker.connected and broker.state == "up" and broker.spid == "spid-a"

    await link.send_json_to(status(0, True, [queue("a"), queue("b")]))
    await link.send_json_to(status(1, False, {"upsert": [queue("a", 5)], "remove": [["/", "b"]]}))
    await link.send_json_to(status(3, False, {"upsert": []}))  # seq 2 went missing
    assert await link.receive_json_from() == {"v": 1, "type": "resync"}
    rows = await database_sync_to_async(
        lambda: sorted(QueueSnapshot.objects.values_list("name", "messages"))
    )()
    assert rows == [("a", 5)]
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    assert broker.is_root and broker.quorum == "3/3" and broker.counts == {"connections": 1}

    await link.disconnect()
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    assert not broker.connected


async def test_commands_reach_the_broker_and_acks_finish_them() -> None:
    link = await connected_link()
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    command = await database_sync_to_async(commands.issue)(broker, "root.disable", None, None)
    assert await database_sync_to_async(commands.deliver)(command.id)
    sent = await link.receive_json_from()
    assert sent == {
        "v": 1,
        "type": "command",
        "id": str(command.id),
        "command": "root.disable",
        "args": {},
    }
    await link.send_json_to(
        {"v": 1, "type": "ack", "id": sent["id"], "ok": True, "result": {"root_enabled": False}}
    )
    # the ack is applied in order with the next message: a status gets its answer after it
    await link.send_json_to(status(0, True, []))
    await link.receive_nothing(timeout=0.3)
    command = await database_sync_to_async(Command.objects.get)(pk=command.pk)
    assert command.state == "acked" and command.result == {"root_enabled": False}
    await link.disconnect()


async def test_a_broker_without_the_current_configuration_gets_it_after_welcome() -> None:
    saved = await database_sync_to_async(configs.save)({"vhosts": ["/"]}, None)
    version = saved.version
    link = communicator()
    assert (await link.connect())[0]
    await link.send_json_to(hello(config_version=None))
    assert await link.receive_json_from() == {"v": 1, "type": "welcome", "config_version": 1}
    command = await link.receive_json_from()
    assert command["command"] == "config.apply"
    assert command["args"] == {"version": 1, "config": {"vhosts": ["/"]}, "serial": 1}
    await link.send_json_to(
        {
            "v": 1,
            "type": "ack",
            "id": command["id"],
            "ok": True,
            "result": {"config_version": 1, "config_checksum": version.checksum, "applied": []},
            "error": None,
        }
    )
    await link.send_json_to(status(0, True, []))
    await link.receive_nothing(timeout=0.3)
    rows = await database_sync_to_async(convergence.broker_rows)(version)
    assert [(r["broker"], r["state"], r["checksum"]) for r in rows] == [
        (NAME, "running", version.checksum)
    ]
    # a status saying it runs its own files again (a reload): drifted, with an alarm
    await link.send_json_to(dict(status(1, True, []), config_version=None, config_checksum=None))
    await link.receive_nothing(timeout=0.3)
    rows = await database_sync_to_async(convergence.broker_rows)(version)
    assert rows[0]["state"] == "drifted" and rows[0]["running"] == "its own configuration files"
    drift = await database_sync_to_async(
        lambda: list(Alarm.objects.filter(kind="config.drift", active=True).values_list("message"))
    )()
    assert drift and "not version 1" in drift[0][0]
    await link.disconnect()

    # back with the version applied: welcome only, nothing to apply
    again = communicator()
    assert (await again.connect())[0]
    await again.send_json_to(hello(config_version=1, config_checksum=version.checksum))
    assert (await again.receive_json_from())["config_version"] == 1
    assert await again.receive_nothing(timeout=0.3)
    await again.disconnect()


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("not json", "JSON"),
        ({"v": 2, "type": "hello"}, "protocol version"),
        ({"v": 1, "type": "status", "seq": 0}, "status before hello"),
        (dict(hello(), broker_type="tertiary"), "hello.broker_type"),
    ],
)
async def test_malformed_messages_close_with_4400(message, reason) -> None:
    link = communicator()
    assert (await link.connect())[0]
    if isinstance(message, str):
        await link.send_to(text_data=message)
    else:
        await link.send_json_to(message)
    closed = await link.receive_output()
    assert closed["type"] == "websocket.close" and closed["code"] == 4400
    assert reason in closed["reason"]


async def test_malformed_status_after_hello_closes_the_link() -> None:
    link = await connected_link()
    await link.send_json_to(status(0, True, [{"vhost": "/"}]))
    closed = await link.receive_output()
    assert closed["code"] == 4400 and "status.queues[0].name" in closed["reason"]
    assert await database_sync_to_async(QueueSnapshot.objects.count)() == 0


async def test_unknown_message_types_are_ignored() -> None:
    link = await connected_link()
    await link.send_json_to({"v": 1, "type": "gossip"})
    await link.send_json_to(status(0, True, [queue("a")]))
    await link.receive_nothing(timeout=0.3)
    assert await database_sync_to_async(QueueSnapshot.objects.count)() == 1
    await link.disconnect()


async def test_browser_paths_are_not_the_broker_link() -> None:
    # an unknown websocket path from an allowed origin is refused cleanly, token or not
    for path in ("/ws/nothing/", "/ws/brokers/extra/"):
        link = communicator(path=path)
        link.scope["headers"].append((b"origin", b"http://127.0.0.1"))
        accepted, _ = await link.connect()
        assert accepted is False
